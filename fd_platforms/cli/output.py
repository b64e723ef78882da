"""The command's own output (the table, the report, ``--json``), which nothing else can write into.

:func:`take_stdout` keeps stdout for the command alone on a private duplicate of its descriptor, and
points descriptor 1 and ``sys.stdout`` at stderr: whatever a plugin prints, or Paddle's C++ side
writes, lands on stderr and can never corrupt ``--json``; a plugin closing descriptor 1 cannot cut
the command's output off. The output is escaped (:func:`~fd_platforms.ipc.console.printable`), and
a write that failed is remembered, so a full disk, ``/dev/full`` or an I/O error on stdout is the
user's one-line error (exit 1), not mistaken for a bug of ours.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, TextIO, TypeGuard

from ..ipc.console import printable

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class _Descriptor(io.RawIOBase):
    """The command's output descriptor; :attr:`failed` is the error of the last write that failed."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd = fd
        self.failed: OSError | None = None

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, data: ReadableBuffer, /) -> int:
        try:
            return os.write(self.fd, data)
        except OSError as exc:
            self.failed = exc
            raise


class _Printable(io.TextIOWrapper):
    """Text whose control characters are escaped before they reach the terminal."""

    def write(self, text: str) -> int:
        return super().write(printable(text))


_guard: _Descriptor | None = None
_output: TextIO | None = None


def take_stdout() -> None:
    """Keep stdout for the command's output (:func:`emit`) and send everything else written there to stderr."""
    global _guard, _output
    stream = sys.stdout
    if stream is None or _output is not None:
        return
    try:
        fd, err = stream.fileno(), sys.stderr.fileno()
    except (OSError, ValueError, AttributeError):  # no real descriptors (a test's capture): nothing to take
        return
    stream.flush()
    _guard = _Descriptor(os.dup(fd))  # not inherited by child processes
    _output = _Printable(
        io.BufferedWriter(_guard),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=bool(stream.line_buffering),
    )
    os.dup2(err, fd)
    sys.stdout = sys.stderr


def emit(text: str) -> None:
    """Write ``text`` and a newline to the command's output."""
    out = sys.stdout if _output is None else _output
    out.write(text + "\n")


def flush_output() -> None:
    """Flush the command's output: a stdout that cannot take it fails here, not at interpreter exit."""
    (sys.stdout if _output is None else _output).flush()


def stdout_failed(exc: BaseException) -> TypeGuard[OSError]:
    """Whether ``exc`` is the error of a failed write of the command's output."""
    failed = None if _guard is None else _guard.failed
    return failed is not None and (failed is exc or (isinstance(exc, OSError) and exc.errno == failed.errno))


def silence_stdout() -> None:
    """Send the command's output to /dev/null, so the interpreter's last flush cannot print a second error."""
    fd = _guard.fd if _guard is not None else sys.stdout.fileno()
    os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
