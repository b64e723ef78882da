"""The splice that applies the porting guide to a FastDeploy checkout (``tests/support/port_splice.py``): its line
rules on small FastDeploy-shaped files, and, where ``FD_PLATFORMS_FASTDEPLOY_TREE`` names a clean FastDeploy work
tree at the guide's commit (with black, isort and ruff at FastDeploy's pins), the recorded count re-measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import port_lines
import pytest
from port_splice import SpliceError, merge, splice

FASTDEPLOY_FILE = '''import os

from fastdeploy.platforms import current_platform


class Runner:
    def __init__(self, fd_config, device: str = "gpu"):
        """Its docstring."""
        self.fd_config = fd_config
        self.device = device

    def clear_cache(self, profile=False):
        """Clear."""
        # a comment of its own
        if self.v1:
            self.controller.free()
        else:
            wait_for_the_manager()
            unset_every_handle()
        self.cache_kvs_map.clear()
        self.share_inputs.pop("caches", None)
        empty_cache()


def main():
    device = os.environ["DEVICE"]
    create_the_cache(device)
    set_the_slot()
    serve(device)
'''


def test_unchanged_lines_are_fastdeploys_the_rest_of_its_lines_go_and_the_def_and_docstring_stay() -> None:
    block = """class Runner(Base):
    def clear_cache(self, profile=False):
        if self.v1:  # unchanged
            self.controller.free()  # unchanged
        else:  # unchanged
            self.kv_cache.clear(strict=False)
        self.cache_kvs_map.clear()  # unchanged
        self.share_inputs.pop("caches", None)  # unchanged
"""
    out = splice("x.py", FASTDEPLOY_FILE, block)
    body = out[out.index("    def clear_cache") : out.index("def main")].rstrip().splitlines()
    assert body == [
        "    def clear_cache(self, profile=False):",
        '        """Clear."""',
        "        if self.v1:",
        "            self.controller.free()",
        "        else:",
        "            self.kv_cache.clear(strict=False)",
        "        self.cache_kvs_map.clear()",
        '        self.share_inputs.pop("caches", None)',
    ]
    assert "wait_for_the_manager" not in out and "a comment of its own" not in out and "empty_cache()" not in out


def test_a_stands_for_line_keeps_fastdeploys_lines_from_to_and_before_and_new_lines_go_where_they_stand() -> None:
    block = """from fd_platforms.engine import manage_kv_cache
from standin import current_platform  # FastDeploy: from fastdeploy.platforms import current_platform


class Runner(Base):
    def __init__(self, fd_config, device="gpu"):
        super().__init__(fd_config, device)  # stands for: its body
        self.kv = plan(fd_config)


def main():
    device = os.environ["DEVICE"]  # unchanged
    managed = manage_kv_cache(device)
    run_the_rest(device)  # stands for: the rest, from `serve(device)`
    return managed
"""
    out = splice("x.py", FASTDEPLOY_FILE, block)
    assert "        self.device = device\n        self.kv = plan(fd_config)\n" in out  # appended to its body
    assert 'def __init__(self, fd_config, device: str = "gpu"):' in out  # its def: the same parameters
    tail = out[out.index("def main") :].splitlines()
    assert tail == [
        "def main():",
        '    device = os.environ["DEVICE"]',
        "    managed = manage_kv_cache(device)",
        "    serve(device)",
        "    return managed",
    ]
    assert out.count("from fastdeploy.platforms import current_platform") == 1  # the file has it
    assert "from fd_platforms.engine import manage_kv_cache\n" in out
    lines = FASTDEPLOY_FILE.splitlines()
    start, end = lines.index("def main():") + 1, len(lines)
    kept = merge(
        lines, start, end, ["    keep()  # stands for: its set-up, before `serve(device)`", "    new()"], "main"
    )
    assert kept == [
        '    device = os.environ["DEVICE"]',
        "    create_the_cache(device)",
        "    set_the_slot()",
        "    new()",
    ]


def test_a_block_that_does_not_fit_fastdeploys_file_is_refused_naming_the_function_and_the_line() -> None:
    with pytest.raises(SpliceError, match=r"x.py Runner.clear_cache: FastDeploy's line 'self.gone\(\)' is not there"):
        splice(
            "x.py",
            FASTDEPLOY_FILE,
            "class Runner:\n    def clear_cache(self, profile=False):\n        self.gone()  # unchanged\n",
        )
    with pytest.raises(SpliceError, match="no class Proposer"):
        splice("x.py", FASTDEPLOY_FILE, "class Proposer:\n    def plan(self):\n        return 1\n")


TREE = os.environ.get("FD_PLATFORMS_FASTDEPLOY_TREE")
FASTDEPLOY_PYTHON = os.environ.get("FD_PLATFORMS_FASTDEPLOY_PYTHON")
HOOKS_PYTHON = os.environ.get("FD_PLATFORMS_HOOKS_PYTHON", sys.executable)


@pytest.fixture
def fastdeploy_copy(tmp_path: Path) -> Path:
    """A clone of the FastDeploy tree ``FD_PLATFORMS_FASTDEPLOY_TREE`` names, at the guide's commit, able to commit."""
    copy = tmp_path / "FastDeploy"
    subprocess.run(["git", "clone", "-q", "--shared", str(TREE), str(copy)], check=True)
    subprocess.run(["git", "checkout", "-q", port_lines.FASTDEPLOY["commit"]], cwd=copy, check=True)
    for key, value in (("user.email", "port@fd-platforms"), ("user.name", "port")):
        subprocess.run(["git", "config", key, value], cwd=copy, check=True)
    return copy


@pytest.mark.skipif(not TREE, reason="FD_PLATFORMS_FASTDEPLOY_TREE names no FastDeploy work tree")
@pytest.mark.parametrize("with_8046", [False, True])
def test_the_recorded_counts_are_the_guides_port_on_a_fastdeploy_checkout(
    fastdeploy_copy: Path, with_8046: bool
) -> None:
    """Splice the guide into a copy of FastDeploy's tree at the guide's commit (with PR #8046 made by hand, or not),
    run FastDeploy's hooks, count; flake8 with FastDeploy's settings passes the ported files."""
    copy, python = fastdeploy_copy, HOOKS_PYTHON
    script = Path(port_lines.__file__).parent / "port_splice.py"
    command = [sys.executable, str(script), str(copy), "--python", python, "--json", *(["--with-8046"] * with_8046)]
    measured = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    recorded = json.loads((script.parent / "fastdeploy_port_count.json").read_text())
    assert measured == recorded[with_8046]
    changed = subprocess.run(["git", "diff", "--name-only"], cwd=copy, check=True, capture_output=True, text=True)
    subprocess.run([python, "-m", "flake8", *changed.stdout.split()], cwd=copy, check=True)


@pytest.mark.skipif(not (TREE and FASTDEPLOY_PYTHON), reason="no FastDeploy tree and Python with its requirements")
def test_fastdeploys_own_tests_that_pass_before_the_port_pass_after_it(fastdeploy_copy: Path) -> None:
    """``fastdeploy_own_tests.py`` on a copy of the tree: the recorded run, again."""
    script = Path(port_lines.__file__).parent / "fastdeploy_own_tests.py"
    command = [sys.executable, str(script), str(fastdeploy_copy), "--python", str(FASTDEPLOY_PYTHON)]
    command += ["--hooks-python", HOOKS_PYTHON]
    measured = json.loads(subprocess.run([*command, "--json"], check=True, capture_output=True, text=True).stdout)
    assert measured == json.loads((script.parent / "fastdeploy_own_tests.json").read_text())
