"""Plain aligned text tables for the CLI."""

from __future__ import annotations

from collections.abc import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; the last column is left unpadded."""
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers) - 1)]
    lines = ["  ".join([*map(str.ljust, row[:-1], widths), row[-1]]) for row in cells]
    return "\n".join(line.rstrip() for line in lines)
