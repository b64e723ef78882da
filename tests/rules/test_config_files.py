"""The files ``plan`` and ``run`` read (a model's ``config.json``, a deploy TOML): a regular file of bounded size
and sane numbers, or one line naming the file and what is wrong with it, before anything is read or started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from error_lines import one_error_line
from run_helpers import QWEN, ROOT
from run_helpers import main_on_cpu as cli

from fd_platforms.contract.errors import ConfigError
from fd_platforms.rules.config import load_model_config

QWEN_CONFIG = ROOT / QWEN / "config.json"


def model_folder(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


# -- what is in the file ----------------------------------------------------------------------------


def test_a_5000_digit_integer_in_config_json(tmp_path: Path) -> None:
    folder = model_folder(
        tmp_path, '{"num_hidden_layers": ' + "9" * 5000 + ', "num_attention_heads": 32, "hidden_size": 4096}'
    )
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "config.json: json=" in line and "Exceeds the limit" in line and len(line) < 800


def test_json_nested_200000_deep(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "[" * 200_000 + "]" * 200_000)
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "json='RecursionError: maximum recursion depth exceeded" in line


def test_an_absurd_layer_count_in_config_json(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, '{"num_hidden_layers": 1e30, "num_attention_heads": 32, "hidden_size": 4096}')
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "num_hidden_layers=1e+30 is not valid; allowed: an integer from 1 to 10000" in line


def test_a_binary_deploy_toml(tmp_path: Path) -> None:
    binary = tmp_path / "deploy.toml"
    binary.write_bytes(bytes(range(256)))
    line = one_error_line(cli("plan", "--config", str(binary)))
    assert f"config={str(binary)!r} is not valid; allowed: a UTF-8 text file in TOML" in line


# -- what the file is: a config that is not a regular file is refused without reading it ----------------


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("flag", ["--config", "--model"])
def test_a_fifo_is_refused_at_once(fifo: Path, command: str, flag: str) -> None:
    line = one_error_line(cli(command, flag, str(fifo), "--device-memory", "1GiB"))
    assert "not a FIFO (named pipe)" in line and str(fifo) in line


@pytest.mark.parametrize("flag", ["--config", "--model"])
def test_a_device_is_refused_without_reading_it(flag: str) -> None:
    line = one_error_line(cli("plan", flag, "/dev/zero", "--device-memory", "1GiB"))
    assert "'/dev/zero'" in line and "not a character device" in line


def test_a_model_folder_whose_config_json_is_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    os.mkfifo(tmp_path / "model" / "config.json")
    line = one_error_line(cli("plan", "--model", str(tmp_path / "model"), "--device-memory", "1GiB"))
    assert "config.json" in line and "not a FIFO (named pipe)" in line


def test_a_folder_as_the_deploy_file_is_named(tmp_path: Path) -> None:
    line = one_error_line(cli("plan", "--config", str(tmp_path)))
    assert "a readable TOML file, not a folder" in line


def test_a_config_file_larger_than_any_config_is_not_read(tmp_path: Path) -> None:
    big = tmp_path / "model" / "config.json"
    big.parent.mkdir()
    with open(big, "wb") as handle:  # sparse: no disk, and nothing is read
        handle.truncate(65 * 2**20)
    line = one_error_line(cli("plan", "--model", str(big.parent), "--device-memory", "1GiB"))
    assert "a readable config.json of at most 64 MiB" in line


def test_a_symlink_to_a_regular_config_works(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").symlink_to(QWEN_CONFIG)
    done = cli("plan", "--model", str(tmp_path / "model"), "--device-memory", "1GiB")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("path", "says"), [(None, "path is not given"), (5, "path=5 is not valid")])
def test_load_model_config_names_a_path_that_is_not_one(path: object, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_model_config(path)  # type: ignore[arg-type]
