"""Device memory Paddle did not allocate — a vendor runtime's allocation or IPC mapping — as a Paddle tensor.

Paddle 3.3 has no Python call that wraps a device pointer on a custom device (its DLPack import
takes CPU and CUDA places only), so a small custom operator does it (``foreign_tensor.cc``): the
tensor's memory is held by an allocation that calls the vendor's release function (``mcFree``,
``mcIpcCloseMemHandle``) when the last tensor over it is gone, as FastDeploy's
``share_external_data`` keeps an opened cache alive.

The operator is compiled with ``g++`` against the installed Paddle's own headers on first use, once
per Paddle build and source, into ``$FD_PLATFORMS_CACHE_DIR`` (default
``$XDG_CACHE_HOME/fd-platforms``, else ``~/.cache/fd-platforms``): about 6 seconds, under a lock,
so ranks that start together compile it once and the others load it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import warnings
from pathlib import Path
from typing import Any

from ..contract.errors import CacheSharingError, ConfigError

ENV_CACHE_DIR = "FD_PLATFORMS_CACHE_DIR"
OPERATOR = "fd_platforms_foreign_tensor"
SOURCE = Path(__file__).with_name("foreign_tensor.cc")
COMPILE_SECONDS = 300  # a compile that takes longer than this is stuck
_registered: set[Path] = set()  # the Paddle installations this process has loaded the operator into


def cache_dir() -> Path:
    """Where compiled operators are kept: ``$FD_PLATFORMS_CACHE_DIR``, else the user's cache folder."""
    raw = os.environ.get(ENV_CACHE_DIR, "")
    if raw:
        if not os.path.isabs(raw):
            raise ConfigError(
                ENV_CACHE_DIR, raw, "an absolute directory path", f"set {ENV_CACHE_DIR}=/abs/path or unset it"
            )
        return Path(raw)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fd-platforms"


def foreign_tensor(paddle: Any, address: int, release: int, shape: tuple[int, ...], dtype: str, device: str) -> Any:
    """A ``dtype`` tensor of ``shape`` on ``device`` over ``address``; ``release`` (a C function's
    address, ``int release(void *)``) is called with ``address`` when the last tensor over it is gone."""
    load_operator(paddle)
    like = paddle.empty([0], dtype=dtype, device=device)
    return paddle._C_ops._run_custom_op(OPERATOR, like, int(address), int(release), [int(n) for n in shape])[0]


def load_operator(paddle: Any) -> None:
    """Load the operator into this process's Paddle (compiling it first where no build is cached)."""
    home = Path(paddle.__file__).parent
    if home in _registered:
        return
    library = _library(home, str(getattr(paddle, "__version__", "unknown")))
    with warnings.catch_warnings():  # paddle.utils.cpp_extension warns that ccache is absent on import
        warnings.simplefilter("ignore")
        paddle.utils.cpp_extension.load_op_meta_info_and_register_op(str(library))
    _registered.add(home)


def _library(home: Path, version: str) -> Path:
    """The compiled operator for the Paddle at ``home``: from the cache, or compiled into it now."""
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, version.encode(), str(home).encode(), sys.version.encode()])).hexdigest()
    folder = cache_dir()
    library = folder / f"{OPERATOR}-{key[:16]}.so"
    if library.is_file():
        return library
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{OPERATOR}-{key[:16]}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be compiling it right now
            if not library.is_file():
                _compile(home, library)
    except OSError as exc:
        raise CacheSharingError(
            f"cannot keep the compiled {OPERATOR} operator in {folder}: {exc}. "
            f"Fix: set {ENV_CACHE_DIR} to a writable directory"
        ) from None
    return library


def _compile(home: Path, library: Path) -> None:
    """Compile :data:`SOURCE` against the Paddle at ``home`` into ``library`` (written whole, then renamed)."""
    compiler = shutil.which("g++")
    include = home / "include"
    if compiler is None:
        raise CacheSharingError(
            f"g++ is not on PATH, and sharing a custom device's KV cache needs the {OPERATOR} operator compiled "
            f"against this Paddle. Fix: install g++ (e.g. apt-get install g++), or copy {library.name} from a "
            f"machine with the same Paddle into {library.parent}"
        )
    if not (include / "paddle" / "extension.h").is_file():
        raise CacheSharingError(
            f"the Paddle at {home} ships no headers (no include/paddle/extension.h), so the {OPERATOR} operator "
            "cannot be compiled. Fix: install a paddlepaddle wheel that ships paddle/include"
        )
    partial = library.with_name(f"{library.name}.{os.getpid()}.partial")
    base = home / "base"
    command = [compiler, "-std=c++17", "-O1", "-fPIC", "-shared", "-w", str(SOURCE), "-o", str(partial)]
    command += [f"-I{include}", f"-I{include / 'third_party'}", f"-I{sysconfig.get_paths()['include']}"]
    command += [f"-L{base}", "-l:libpaddle.so", f"-Wl,-rpath,{base}"]
    # its own session: a timed-out compile is killed with the compiler passes g++ started (cc1plus, as, ld)
    compiling = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = compiling.communicate(timeout=COMPILE_SECONDS)
    except subprocess.TimeoutExpired:
        raise CacheSharingError(
            f"compiling the {OPERATOR} operator took over {COMPILE_SECONDS:g} s. Fix: check the machine's load, "
            f"or compile it where g++ is faster and copy {library.name} into {library.parent}"
        ) from None
    finally:  # the compiler is killed and its partial output removed before any error leaves
        if compiling.returncode is None:  # timed out, or this process was interrupted
            os.killpg(compiling.pid, signal.SIGKILL)
            compiling.communicate()
            partial.unlink(missing_ok=True)
    if compiling.returncode != 0:
        partial.unlink(missing_ok=True)
        tail = " | ".join(stderr.strip().splitlines()[-3:])
        raise CacheSharingError(
            f"g++ could not compile the {OPERATOR} operator against the Paddle at {home} (exit status "
            f"{compiling.returncode}): {tail}. Fix: use a paddlepaddle wheel whose headers match the library"
        )
    os.replace(partial, library)
