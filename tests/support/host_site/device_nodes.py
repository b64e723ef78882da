"""``python device_nodes.py NODE... -- COMMAND...``: run COMMAND where ``/dev`` also holds NODEs.

A private mount namespace (this process and what it starts) gets a fresh ``/dev``: every entry of
the real one bound in again (``/dev/shm``, ``/dev/null``, ... stay the same files), plus a character
device for each NODE (``nvidia0``: major 195 minor 0, as NVIDIA's driver makes it; other names
minor 0 of major 1), so a program sees the device nodes of an accelerator host and nothing else
changes. Needs root (CAP_SYS_ADMIN); exits 3 naming the step where the kernel refuses.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
import sys

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 0x1000, 0x4000, 0x40000
NVIDIA_MAJOR = 195
REFUSED = 3

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [None if value is None else value.encode() for value in (source, target, fstype, data)]
    if _libc.mount(*encoded[:3], ctypes.c_ulong(flags), encoded[3]) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def _device_number(name: str) -> int:
    found = re.fullmatch(r"nvidia(\d+)", name)
    return os.makedev(NVIDIA_MAJOR, int(found.group(1))) if found else os.makedev(1, 0)


def private_dev(nodes: list[str]) -> None:
    """This process's own ``/dev``: the real entries bound in, and ``nodes`` added.

    The real ``/dev`` is reached, once the tmpfs covers it, through a descriptor opened before
    (``/proc/self/fd/N/<entry>`` is the entry of the mount it was opened on): no folder is made
    anywhere for it, so none is left behind."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    real = os.open("/dev", os.O_RDONLY | os.O_DIRECTORY)  # not inherited: closed by the exec if not before
    try:
        _mount("tmpfs", "/dev", "tmpfs", 0, "mode=755")
        for name in os.listdir(real):
            source, target = f"/proc/self/fd/{real}/{name}", os.path.join("/dev", name)
            mode = os.lstat(name, dir_fd=real).st_mode
            if stat.S_ISLNK(mode):
                os.symlink(os.readlink(name, dir_fd=real), target)
                continue
            if stat.S_ISDIR(mode):
                os.mkdir(target)
            else:
                open(target, "w").close()
            _mount(source, target, None, MS_BIND | MS_REC)
    finally:
        os.close(real)
    for name in nodes:
        os.mknod(os.path.join("/dev", name), 0o666 | stat.S_IFCHR, _device_number(name))


def main(argv: list[str]) -> int:
    split = argv.index("--")
    nodes, command = argv[:split], argv[split + 1 :]
    try:
        private_dev(nodes)
    except OSError as exc:
        print(f"device_nodes.py: cannot make a private /dev here: {exc}", file=sys.stderr)
        return REFUSED
    os.execvp(command[0], command)
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
