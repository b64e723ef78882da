"""Lines on the console: each written with one ``write``, so lines of several processes never merge.

``print(text, file=sys.stderr)`` writes the text and the newline separately; with stderr unbuffered
(``PYTHONUNBUFFERED``, ``python -u``) that is two system calls, and another process writing to the
same pipe in between splits the line. One write of a line up to ``PIPE_BUF`` (4 KiB on Linux) to a
pipe is atomic.
"""

from __future__ import annotations

import sys
from typing import TextIO


def write_line(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` and its newline to ``stream`` (default: stderr) in one call, then flush."""
    out = sys.stderr if stream is None else stream
    out.write(text + "\n")
    out.flush()
