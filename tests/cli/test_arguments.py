"""The commands' arguments: a misspelled platform name gets the closest one, ``--platform all`` is ``plan``'s,
``--tp`` must split the model's heads, and ``--help`` shows every default."""

from __future__ import annotations

import re

import pytest
from error_lines import one_error_line
from run_helpers import QWEN
from run_helpers import main_in_process as cli


@pytest.mark.parametrize(
    ("command", "env", "says"),
    [
        (("plan", "--platform", "cdua", "--model", QWEN, "--device-memory", "1GiB"), {}, "--platform='cdua'"),
        (("plan", "--model", QWEN, "--device-memory", "1GiB"), {"FD_PLATFORM": "cdua"}, "FD_PLATFORM='cdua'"),
        (("run", "--platform", "cdua", "--model", QWEN, "--device-memory", "256MiB"), {}, "--platform='cdua'"),
        (("check", "cdua"), {}, "NAME='cdua'"),
    ],
    ids=["plan", "FD_PLATFORM", "run", "check"],
)
def test_a_misspelled_platform_name_gets_the_closest_one(
    command: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    line = one_error_line(cli(*command, **env))
    assert says in line and "Fix: did you mean 'cuda'?" in line


def test_run_names_the_platform_by_the_flag_the_user_gave_not_by_fd_platform() -> None:
    line = one_error_line(
        cli("run", "--platform", "cuda", "--model", QWEN, "--device-memory", "256MiB", FD_PLATFORM_PLUGINS="xpu")
    )
    assert line.startswith("fd-platforms: error: --platform='cuda' is excluded by FD_PLATFORM_PLUGINS='xpu'"), line
    assert "FD_PLATFORM=" not in line.replace("FD_PLATFORM_PLUGINS", "")


def test_run_platform_all_says_all_is_for_plan() -> None:
    line = one_error_line(cli("run", "--platform", "all", "--model", QWEN, "--device-memory", "256MiB"))
    assert "--platform='all' is not valid" in line and "use fd-platforms plan --platform all" in line


@pytest.mark.parametrize(
    ("tp", "why"),
    [("3", "num_attention_heads=32 is not divisible by 3"), ("64", "num_attention_heads=32 is not divisible by 64")],
)
def test_a_tensor_parallel_size_that_does_not_split_the_model(tp: str, why: str) -> None:
    line = one_error_line(cli("plan", "--model", QWEN, "--tp", tp, "--device-memory", "80GiB"))
    assert f"--tp={tp} is not valid" in line and why in line, "named by the flag the user gave"
    assert "for qwen3-30b-a3b: 1, 2, 4, 8, 16, 32" in line


def test_help_shows_a_default_of_zero() -> None:
    done = cli("run", "--help")
    assert re.search(r"--cycles N\s+then clear .*\(default: 0\)", " ".join(done.stdout.split())), done.stdout


def test_a_model_path_that_names_no_config_says_so_not_how_to_repair_a_config_json() -> None:
    line = one_error_line(cli("plan", "--model", "README.md", "--device-memory", "1GiB", FD_PLATFORM="cpu"))
    assert line.startswith("fd-platforms: error: README.md: json=") and "config.json" not in line.split("Fix:")[0]
    assert line.endswith("Fix: README.md is no model config: name the model's folder or its config.json")
