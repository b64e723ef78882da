"""FastDeploy PR #8046 ("Create KV Cache in Worker When Enable Cache Storage", develop, 2026-06-15) made by hand on
c1b7c083, as far as this package read it: its review threads' hunks (its description is the empty template), each
change marked seen or inferred. ``port_splice.py --with-8046`` makes them before the port."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class HunkError(AssertionError):
    """A change does not fit the tree: names the file, the line and how often it was found."""


OLD_CREATE = (
    "create_cache_tensor = profile or not (",
    "self.fd_config.cache_config.kvcache_storage_backend",
    'or self.fd_config.scheduler_config.splitwise_role != "mixed"',
    ")",
)
NEW_CREATE = 'create_cache_tensor = profile or self.fd_config.scheduler_config.splitwise_role == "mixed"'


@dataclass(frozen=True)
class Hunk:
    """One change of FastDeploy PR #8046 (develop, 2026-06-15), made by hand on c1b7c083: ``lines`` (stripped)
    become ``new`` (indented as the first of them), ``count`` times in ``file``; ``seen`` says whether its review
    hunk was read (``True``) or the change is inferred from the PR's title and its seen hunks."""

    file: str
    lines: tuple[str, ...]
    new: tuple[str, ...]
    count: int
    seen: bool
    source: str


PR_8046 = (
    Hunk(
        "fastdeploy/cache_manager/prefix_cache_manager.py",
        ("if not self.enable_splitwise:", 'storage_arg_str += " --create_cache_tensor"'),
        (),
        1,
        True,
        "review thread prefix_cache_manager.py:299 (@@ -296,8 +296,6 @@): no --create_cache_tensor for storage",
    ),
    Hunk(
        "fastdeploy/engine/args_utils.py",
        ('if not current_platform.is_cuda() or self.splitwise_role == "prefill":',),
        (
            'if self.splitwise_role == "decode":',
            "    self.enable_prefix_caching = False",
            'if not current_platform.is_cuda() or self.splitwise_role == "prefill":',
        ),
        1,
        True,
        "review thread args_utils.py:647 (@@ -643,6 +643,8 @@): no prefix caching in decode",
    ),
    Hunk(
        "fastdeploy/worker/metax_model_runner.py",
        OLD_CREATE,
        (NEW_CREATE,),
        2,
        False,
        "review thread metax_model_runner.py:2493 (@@ -2491,10 +2488,7 @@) shows clear_cache's 4-line expression "
        "shrinking by 3 lines, cut off; its result and the create side at ~L1350 inferred",
    ),
    Hunk(
        "fastdeploy/spec_decode/mtp_cuda.py",
        OLD_CREATE,
        (NEW_CREATE,),
        1,
        False,
        "#8045's mtp.py clear_mtp_cache hunk (release/2.6) reads profile or splitwise_role == 'mixed'; develop's "
        "clear_mtp_cache is in mtp_cuda.py, its hunk not seen",
    ),
    Hunk("fastdeploy/spec_decode/mtp.py", OLD_CREATE, (NEW_CREATE,), 1, False, "the title: the worker creates"),
    Hunk("fastdeploy/worker/gpu_model_runner.py", OLD_CREATE, (NEW_CREATE,), 2, False, "the title: the worker creates"),
    Hunk("fastdeploy/worker/xpu_model_runner.py", OLD_CREATE, (NEW_CREATE,), 1, False, "the title: the worker creates"),
    Hunk(
        "fastdeploy/worker/gpu_model_runner.py",
        ("if self.fd_config.cache_config.num_cpu_blocks > 0:",),
        ("if self.fd_config.cache_config.num_cpu_blocks > 0 or self.fd_config.cache_config.kvcache_storage_backend:",),
        1,
        False,
        "the creator's clear waits for the transfer manager a storage backend starts (the mtp.py:463 hunk of #8045 "
        "starts 'if num_cpu_blocks > 0 or kvcache_storage_...' and is cut off)",
    ),
)
"""The changes, in the order they are made (``docs/porting-fastdeploy.md`` lists them)."""


def apply_hunks(tree: Path, hunks: tuple[Hunk, ...] = PR_8046) -> list[str]:
    """Make ``hunks`` in the FastDeploy work tree ``tree``; the files changed."""
    for hunk in hunks:
        path = tree / hunk.file
        lines = path.read_text(encoding="utf-8").splitlines()
        done, index = 0, 0
        while index <= len(lines) - len(hunk.lines):
            if tuple(line.strip() for line in lines[index : index + len(hunk.lines)]) == hunk.lines:
                indent = lines[index][: len(lines[index]) - len(lines[index].lstrip())]
                lines[index : index + len(hunk.lines)] = [indent + line for line in hunk.new]
                done, index = done + 1, index + len(hunk.new)
                continue
            index += 1
        if done != hunk.count:
            raise HunkError(f"{hunk.file}: {hunk.lines[0]!r} found {done} times, {hunk.count} expected")
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sorted({hunk.file for hunk in hunks})
