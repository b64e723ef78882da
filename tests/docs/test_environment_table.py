"""docs/environment.md is the one table of the environment variables fd-platforms reads: every ``FD_*`` name the
package's code reads is a row, every row is read, and the defaults it quotes are the code's."""

from __future__ import annotations

import re
from pathlib import Path

from fd_platforms.ipc import cache_signal
from fd_platforms.loading import watchdog

ROOT = Path(__file__).resolve().parents[2]
TABLE = (ROOT / "docs" / "environment.md").read_text()
ROWS = {match.group(1): match.group(0) for match in re.finditer(r"^\| `(FD_[A-Z_]+)` \|.*$", TABLE, re.MULTILINE)}


def names_the_code_reads() -> set[str]:
    """Every ``"FD_..."`` string literal in the package's code outside docstrings and comments: the variables it
    reads, or sets for its own children."""
    found: set[str] = set()
    for path in (ROOT / "fd_platforms").rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            found.update(re.findall(r"[\"'](FD_[A-Z][A-Z_]*)[\"']", line.split("#", 1)[0]))
    return found


def test_every_variable_the_code_reads_is_a_row_and_every_row_is_read() -> None:
    assert names_the_code_reads() == set(ROWS)


def test_the_defaults_quoted_are_the_codes() -> None:
    assert ROWS["FD_PLATFORM_DETECT_TIMEOUT"].endswith(f"| {watchdog.DEFAULT_DETECT_TIMEOUT:g} s |")
    assert ROWS["FD_PLATFORM_ALLOC_TIMEOUT"].endswith(f"| {watchdog.DEFAULT_ALLOC_TIMEOUT:g} s |")
    assert f"| {cache_signal.DEFAULT_TIMEOUT:g} s under our protocol" in ROWS["FD_CACHE_READY_TIMEOUT"]


def test_the_readme_points_to_the_table() -> None:
    assert "[docs/environment.md](docs/environment.md)" in (ROOT / "README.md").read_text()
