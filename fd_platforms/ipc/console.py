"""Lines on the console: each written with one ``write``, so lines of several processes never merge.

``print(text, file=sys.stderr)`` writes the text and the newline separately; with stderr unbuffered
(``PYTHONUNBUFFERED``, ``python -u``) that is two system calls, and another process writing to the
same pipe in between splits the line. One write of a line up to ``PIPE_BUF`` (4 KiB on Linux) to a
pipe is atomic.

Text that reaches a terminal may come from a config file (a model's ``_name_or_path``) or a
plugin (a detection's reason): :func:`printable` escapes its control characters, so none can move
the cursor, clear the screen, rewrite a line or reorder text (bidi overrides).
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab written as its escape (``\\x1b``)."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def write_line(text: str, stream: TextIO | None = None) -> None:
    """Write ``text`` (:func:`printable`) and its newline to ``stream`` (default: stderr) in one call, then flush."""
    out = sys.stderr if stream is None else stream
    out.write(printable(text) + "\n")
    out.flush()
