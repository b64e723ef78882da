"""Reading a configuration file: a regular file of bounded size, never a device, a FIFO or a folder.

``--config /dev/zero`` would otherwise read until memory runs out, and a FIFO would block the read
forever. What is at the path is judged by ``stat`` before anything is opened, and again by
``fstat`` on what was opened (the path may change in between); only then is it read, at most
:data:`MAX_FILE_BYTES`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ...contract.errors import ConfigError

MAX_FILE_BYTES = 64 * 2**20  #: a config.json or a deploy TOML holds kilobytes
_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def read_config_file(path: Path, field: str, what: str) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed); a ConfigError naming ``field``,
    the path and ``what`` is expected for anything else, or for a file over :data:`MAX_FILE_BYTES`."""
    try:
        _check_regular(os.stat(path), path, field, what)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(field, str(path), what, f"check the path ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        _check_regular(os.fstat(fd), path, field, what)
        try:
            data = handle.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(field, str(path), what, f"check the file ({exc.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        limit = f"{what} of at most {MAX_FILE_BYTES // 2**20} MiB"
        raise ConfigError(field, str(path), limit, "pass the file itself, not a data file")
    return data


def _check_regular(info: os.stat_result, path: Path, field: str, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = _KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")
        raise ConfigError(field, str(path), f"{what}, not {kind}", "pass the path of a regular file")
