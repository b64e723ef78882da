"""The sweep of attacher marks whose slots are gone (:func:`~fd_platforms.fastdeploy.marks.sweep_orphan_marks`):
it removes only what it recognises in full as a dead mark of ours, and says what it removed in one line."""

from __future__ import annotations

import logging
import os
import secrets
import struct
from pathlib import Path

import pytest

from fd_platforms.fastdeploy.marks import attacher_prefix, sweep_orphan_marks

MARK = struct.Struct("=qqq")  # pid, rank, attachers per rank: what make_attacher_mark writes


def plant(name: str, content: bytes) -> Path:
    path = Path("/dev/shm", name)
    path.write_bytes(content)
    path.chmod(0o600)
    return path


def test_only_marks_recognised_in_full_are_removed_and_one_line_says_how_many(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = f"t{secrets.token_hex(4)}"  # no cache_ready_signal under it: every mark's slot is gone
    prefix = attacher_prefix(gone, 0)
    ours = [plant(f"{prefix}{4000 + n}-{secrets.token_hex(8)}", MARK.pack(4000 + n, 0, 1)) for n in range(50)]
    not_ours = [
        plant(f"{prefix}4100-{secrets.token_hex(8)}", struct.pack("=q", 4100)),  # a positive int64 and no more
        plant(f"{prefix}4101-{secrets.token_hex(8)}", MARK.pack(4999, 0, 1)),  # its name says another pid
        plant(f"{prefix}4102-{secrets.token_hex(8)}", MARK.pack(4102, 3, 1)),  # another rank than its name's
        plant(f"{prefix}4103-{secrets.token_hex(8)}", MARK.pack(4103, 0, 9)),  # a count no deployment has
        plant(f"{prefix}notes.txt", MARK.pack(4104, 0, 1)),  # not a mark's name
    ]
    try:
        with caplog.at_level(logging.WARNING, logger="fd_platforms.fastdeploy.marks"):
            removed = sweep_orphan_marks()
        assert sorted(removed) == sorted(path.name for path in ours)
        assert not any(path.exists() for path in ours) and all(path.exists() for path in not_ours)
        said = [record.getMessage() for record in caplog.records if record.name == "fd_platforms.fastdeploy.marks"]
        assert len(said) == 1 and said[0].startswith("removed 50 dead FastDeploy attacher mark(s)"), said
        assert said[0].endswith("and 47 more")
    finally:
        for path in [*ours, *not_ours]:
            if path.exists():
                os.unlink(path)
