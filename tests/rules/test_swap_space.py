"""Host swap space, from a deploy TOML or ``--swap-space``: beyond 8 EiB, below one block, or beyond the host, it is
one line naming ``swap_space`` (never a plugin hook), before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from error_lines import one_error_line
from run_helpers import QWEN, ROOT
from run_helpers import main_on_cpu as cli

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import load_deploy_config


def test_a_huge_swap_space_in_toml_names_swap_space(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(f'[model]\npath = "{ROOT / QWEN}"\n[cache]\nswap_space = {"9" * 4000}\n')
    line = one_error_line(cli("plan", "--config", str(deploy), "--device-memory", "80GiB"))
    assert line.startswith(f"fd-platforms: error: {deploy}: cache.swap_space=<an integer of 4000 digits> is not valid")
    assert "at most 8 EiB" in line and "plugin" not in line and "should_create_cache_tensor" not in line
    with pytest.raises(ConfigError) as info:
        load_deploy_config(deploy)
    assert info.value.field == "cache.swap_space"
    # Past 4300 digits Python's TOML reader itself refuses the number: still one line, about the file.
    deploy.write_text(f'[model]\npath = "{ROOT / QWEN}"\n[cache]\nswap_space = {"9" * 5000}\n')
    line = one_error_line(cli("plan", "--config", str(deploy), "--device-memory", "80GiB"))
    assert f"{deploy}: toml='ValueError: Exceeds the limit" in line and "plugin" not in line


@pytest.mark.parametrize("command", ["plan", "run"])
def test_swap_space_smaller_than_one_block_names_the_block(command: str) -> None:
    line = one_error_line(
        cli(command, "--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--swap-space", "1MiB")
    )
    assert "swap_space='1.00 MiB' is not valid; allowed: 0 (no host swap space) or at least one block, 3.00 MiB" in line


def test_host_swap_beyond_the_host_is_refused_before_any_process_starts() -> None:
    done = cli("run", "--model", QWEN, "--tp", "2", "--device-memory", "256MiB", "--swap-space", "100000")
    line = one_error_line(done)  # one line: no "started 2 worker(s)" before it
    assert "swap_space='97.66 TiB' is not valid; allowed: host swap space that fits in host memory" in line
