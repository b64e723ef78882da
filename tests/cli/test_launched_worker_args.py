"""``examples/launched_worker.py`` checks ``--memory-mib`` and ``ENGINE_SUFFIX`` before it plans or launches
anything: a bad value is argparse's one line naming it, with exit code 2, never a traceback."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType

import pytest

from fd_platforms.fastdeploy import hand_off_block_count

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def example(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The example as the launcher starts it (rank 0 of 2), its worker replaced by a recorder."""
    spec = importlib.util.spec_from_file_location("launched_example_args", ROOT / "examples" / "launched_worker.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    module.started = []
    monkeypatch.setattr(module, "worker", module.started.append)
    monkeypatch.setenv("PADDLE_TRAINER_ID", "0")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    monkeypatch.delenv("ENGINE_SUFFIX", raising=False)
    return module


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--memory-mib"], "argument --memory-mib: expected at least one argument"),
        (["--memory-mib", "abc"], "--memory-mib: 'abc' is not valid; allowed: a whole number of MiB from 1 to"),
        (["--memory-mib", "96,x"], "--memory-mib: 'x' is not valid"),
        (["--memory-mib", "96,,64"], "--memory-mib: '' is not valid"),
        (["--memory-mib", "0,64"], "--memory-mib: '0' is not valid"),
        (["--memory-mib=-5,64"], "--memory-mib: '-5' is not valid"),
        (["--memory-mib", "-5,64"], "--memory-mib: '-5' is not valid"),
        (["--memory-mib", "1e3,64"], "--memory-mib: '1e3' is not valid"),
        (["--memory-mib", "²,64"], "--memory-mib: '²' is not valid"),
        (["--memory-mib", "99999999999,64"], "--memory-mib: '99999999999' is not valid"),
        (["--memory-mib", "96"], "--memory-mib has 1 value(s) but the launcher started 2 rank(s)"),
        (["--memory-mib", "96,64,32"], "--memory-mib has 3 value(s) but the launcher started 2 rank(s)"),
        (["--memory-mib", "96,64", "--tp", "2"], "unrecognized arguments: --tp 2"),
    ],
)
def test_a_bad_memory_mib_is_one_line_with_exit_2_before_anything_starts(
    example: ModuleType, capsys: pytest.CaptureFixture[str], argv: list[str], said: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        example.main(argv)
    assert stopped.value.code == 2 and example.started == []
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("launched_worker.py: error: ") and said in error, error


@pytest.mark.parametrize("argv", [["--memory-mib", "96,64"], ["--memory-mib", "96", "64"], []])
def test_memory_mib_takes_commas_or_spaces_and_defaults_to_the_examples(example: ModuleType, argv: list[str]) -> None:
    assert example.main(argv) == 0
    assert example.started == [[96, 64]]


@pytest.mark.parametrize("suffix", ["a b", "../x", "x" * 65])
def test_a_bad_engine_suffix_is_refused_before_planning(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], suffix: str
) -> None:
    monkeypatch.setenv("ENGINE_SUFFIX", suffix)
    with pytest.raises(SystemExit) as stopped:
        example.main(["--memory-mib", "96,64"])
    assert stopped.value.code == 2 and example.started == []
    assert f"ENGINE_SUFFIX={suffix!r} is not valid; allowed: letters, digits" in capsys.readouterr().err


def test_without_a_launcher_it_asks_for_a_value_per_rank_it_launches(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PADDLE_TRAINER_ID")
    monkeypatch.delenv("PADDLE_TRAINERS_NUM")
    with pytest.raises(SystemExit) as stopped:
        example.main(["--memory-mib", "96,64,32"])
    assert stopped.value.code == 2
    assert f"but this example launches {example.LOCAL_RANKS} rank(s)" in capsys.readouterr().err


@pytest.mark.parametrize("signal", ["missing", "a directory", "3 bytes long"])
def test_an_unusable_engine_signal_is_one_line_with_its_exit_code_not_a_traceback(
    example: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], signal: str
) -> None:
    suffix = f"fdptest{os.getpid()}"
    path = Path(f"/dev/shm/get_profile_block_num.{suffix}")
    if signal == "a directory":
        path.mkdir()
    elif signal == "3 bytes long":
        path.write_bytes(bytes(3))
    monkeypatch.setattr(example, "worker", lambda memory_mib: hand_off_block_count(suffix, 10))  # its last step
    try:
        code = example.main(["--memory-mib", "96,64"])
    finally:
        if path.is_dir():
            path.rmdir()
        path.unlink(missing_ok=True)
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert err.startswith(f"launched_worker.py: error: FastDeploy signal 'get_profile_block_num.{suffix}' ") and (
        err.count("\n") == 1
    ), err
