"""Bad input from the outside review: each is one line naming the caller's field, exit 2, no traceback,
and the error is blamed on the caller, never on a plugin that had not run yet."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fd_platforms.contract.errors import ConfigError, PluginError, RecordError
from fd_platforms.contract.types import CacheDecision, Detection, DeviceMemory, HostBuffer, Plan, PlatformLimit
from fd_platforms.loading.selection import select_platform
from fd_platforms.rules.config import CacheConfig, ModelConfig, ParallelConfig, load_deploy_config
from fd_platforms.rules.layout import build_layout
from run_helpers import QWEN, ROOT
from run_helpers import main_in_process as cli

QWEN_DIR = ROOT / QWEN


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("fd-platforms: error: ") and "Fix:" in line, line
    return line


def model_folder(tmp_path: Path, text: str) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(text)
    return folder


# -- item 9: tracebacks on bad input ------------------------------------------------------------


def test_a_5000_digit_integer_in_config_json(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, '{"num_hidden_layers": ' + "9" * 5000 + ', "num_attention_heads": 32, "hidden_size": 4096}')
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "config.json: json=" in line and "Exceeds the limit" in line and len(line) < 800


def test_json_nested_200000_deep(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, "[" * 200_000 + "]" * 200_000)
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "json='RecursionError: maximum recursion depth exceeded" in line


def test_a_binary_deploy_toml(tmp_path: Path) -> None:
    binary = tmp_path / "deploy.toml"
    binary.write_bytes(bytes(range(256)))
    line = one_error_line(cli("plan", "--config", str(binary)))
    assert f"config={str(binary)!r} is not valid; allowed: a UTF-8 text file in TOML" in line


@pytest.mark.parametrize(
    ("args", "env", "field"),
    [
        (("--timeout", "3e6"), {}, "timeout=3000000.0"),
        ((), {"FD_CACHE_READY_TIMEOUT": "1e9"}, "FD_CACHE_READY_TIMEOUT='1e9'"),
    ],
)
def test_timeouts_too_long_for_the_os_are_refused_before_anything_starts(
    args: tuple[str, ...], env: dict[str, str], field: str
) -> None:
    line = one_error_line(cli("run", "--model", QWEN, "--device-memory", "256MiB", *args, **env))
    assert f"{field} is not valid; allowed: a finite number of seconds > 0 and at most 604800 (7 days)" in line


def test_an_absurd_layer_count_in_config_json(tmp_path: Path) -> None:
    folder = model_folder(tmp_path, '{"num_hidden_layers": 1e30, "num_attention_heads": 32, "hidden_size": 4096}')
    line = one_error_line(cli("plan", "--model", str(folder), "--device-memory", "1GiB"))
    assert "num_hidden_layers=1e+30 is not valid; allowed: an integer from 1 to 10000" in line


@pytest.mark.parametrize(("tp", "why"), [("3", "num_attention_heads=32 is not divisible by 3"),
                                         ("64", "num_attention_heads=32 is not divisible by 64")])  # fmt: skip
def test_a_tensor_parallel_size_that_does_not_split_the_model(tp: str, why: str) -> None:
    line = one_error_line(cli("plan", "--model", QWEN, "--tp", tp, "--device-memory", "80GiB"))
    assert f"parallel.tensor_parallel_size={tp} is not valid" in line and why in line
    assert "for qwen3-30b-a3b: 1, 2, 4, 8, 16, 32" in line


# -- item 10: the caller's field, before any hook runs ---------------------------------------------


def test_a_huge_swap_space_in_toml_names_swap_space(tmp_path: Path) -> None:
    deploy = tmp_path / "deploy.toml"
    deploy.write_text(f'[model]\npath = "{QWEN_DIR}"\n[cache]\nswap_space = {"9" * 4000}\n')
    line = one_error_line(cli("plan", "--config", str(deploy), "--device-memory", "80GiB"))
    assert line.startswith(f"fd-platforms: error: {deploy}: cache.swap_space=<an integer of 4000 digits> is not valid")
    assert "at most 8 EiB" in line and "plugin" not in line and "should_create_cache_tensor" not in line
    with pytest.raises(ConfigError) as info:
        load_deploy_config(deploy)
    assert info.value.field == "cache.swap_space"
    # Past 4300 digits Python's TOML reader itself refuses the number: still one line, about the file.
    deploy.write_text(f'[model]\npath = "{QWEN_DIR}"\n[cache]\nswap_space = {"9" * 5000}\n')
    line = one_error_line(cli("plan", "--config", str(deploy), "--device-memory", "80GiB"))
    assert f"{deploy}: toml='ValueError: Exceeds the limit" in line and "plugin" not in line


@pytest.fixture
def cpu():
    return select_platform({"FD_PLATFORM": "cpu"}).platform


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, creator_pid=2**40), "creator_pid"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, creator_pid=True), "creator_pid"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", -1), "rank"),
        (lambda p: p.wait_cache_ready("../etc/passwd", 0), "signal_name"),
        (lambda p: p.wait_cache_ready("fd_cache_ready.x", 0, timeout=1e9), "timeout"),
        (lambda p: p.max_num_blocks(layout="x", cache=CacheConfig()), "layout"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache={"block_size": 64}), "cache"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), memory=80), "memory"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), non_cache_bytes=-1), "non_cache_bytes"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), non_cache_bytes=1.5), "non_cache_bytes"),
        (lambda p: p.max_num_blocks(layout=LAYOUT, cache=CacheConfig(), host_memory="lots"), "host_memory"),
        (lambda p: p.device_memory("0"), "device_id"),
        (lambda p: p.device_memory(-1), "device_id"),
        (lambda p: p.host_alloc(10, require_pinned="no"), "require_pinned"),
        (lambda p: p.host_alloc(10.0), "nbytes"),
        (lambda p: p.host_alloc(2**80), "nbytes"),
        (lambda p: p.should_create_cache_tensor(profile=False, num_cpu_blocks=10**5000, storage_backend=None,
                                                splitwise_role="mixed"), "num_cpu_blocks"),  # fmt: skip
        (lambda p: p.should_create_cache_tensor(profile="yes", num_cpu_blocks=0, storage_backend=None,
                                                splitwise_role="mixed"), "profile"),  # fmt: skip
    ],
)
def test_platform_calls_blame_the_callers_argument(cpu, call, field: str) -> None:
    with pytest.raises(ConfigError) as info:
        call(cpu)
    assert info.value.field == field and not isinstance(info.value, PluginError)
    assert "Fix:" in str(info.value) and len(str(info.value)) < 600


def test_a_plugin_hook_never_runs_on_a_bad_argument(make_plugin) -> None:
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, PlatformIdentity\n"
        "CALLS = []\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('spy', 'spy', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef device_memory(device_id):\n    CALLS.append(device_id)\n    raise RuntimeError('reached')\n"
        "@hookimpl\ndef host_alloc(nbytes, require_pinned):\n    CALLS.append(nbytes)\n    raise RuntimeError('reached')\n"
    )
    make_plugin("spy", source=source)
    platform = select_platform({"FD_PLATFORM": "spy"}).platform
    for call in (lambda: platform.device_memory(-1), lambda: platform.host_alloc(0), lambda: platform.host_alloc(8, require_pinned=1)):
        with pytest.raises(ConfigError):
            call()
    import fd_test_plugin_fd_test_spy as spy  # type: ignore[import-not-found]

    assert spy.CALLS == []
    with pytest.raises(PluginError, match="hook device_memory raised RuntimeError: reached"):
        platform.device_memory(0)  # a good argument reaches the plugin, whose failure is its own


LAYOUT = build_layout(ModelConfig("m", 2, 8, 8, 64), CacheConfig(), ParallelConfig())


# -- item 13: records validate their fields -------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "words"),
    [
        (lambda: DeviceMemory("80GiB", None, None, "x"), "DeviceMemory.total_bytes='80GiB'"),
        (lambda: DeviceMemory(8.0e10, None, None, "x"), "DeviceMemory.total_bytes=80000000000.0"),
        (lambda: DeviceMemory(2**30, 2**31, None, "x"), "DeviceMemory.free_bytes=2147483648 is not valid; allowed: at most"),
        (lambda: DeviceMemory(2**30, None, -1, "x"), "DeviceMemory.process_bytes=-1"),
        (lambda: Detection("yes", "r", 1), "Detection.available='yes'"),
        (lambda: Detection(True, "r", 1.0), "Detection.device_count=1.0"),
        (lambda: CacheDecision(1, "none", "r"), "CacheDecision.create=1"),
        (lambda: CacheDecision(True, "always", "r"), "CacheDecision.deciding_term='always'"),
        (lambda: PlatformLimit("max_num_blocks", 0, "kernel limit"), "PlatformLimit.value=0"),
        (lambda: PlatformLimit("max_num_blocks", 10, " "), "PlatformLimit.reason=' '"),
        (lambda: Plan(1.5, 1, 1, 64, 1, "memory", "r", 0), "Plan.num_blocks=1.5"),
        (lambda: Plan(1, 1, 1, 64, 1, "luck", "r", 0), "Plan.binding='luck'"),
        (lambda: HostBuffer(0x1000, 10, "no", "pageable", _free=lambda: None), "HostBuffer.pinned='no'"),
        (lambda: HostBuffer(0x1000, 0, False, "pageable", _free=lambda: None), "HostBuffer.nbytes=0"),
    ],
)
def test_records_refuse_fields_of_the_wrong_type_or_range(build, words: str) -> None:
    with pytest.raises(RecordError) as info:
        build()
    assert words in str(info.value) and "Fix:" in str(info.value)


def test_a_plugin_building_a_bad_record_is_its_contract_error(make_plugin) -> None:
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, DeviceMemory, PlatformIdentity\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('sloppy', 'sloppy', None)\n"
        "@hookimpl\ndef detect_platform():\n    return Detection(True, 'here', 1)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef device_memory(device_id):\n    return DeviceMemory('80GiB', None, None, 'sloppy')\n"
    )
    make_plugin("sloppy", source=source)
    platform = select_platform({"FD_PLATFORM": "sloppy"}).platform
    with pytest.raises(PluginError) as info:
        platform.device_memory(0)
    message = str(info.value)
    assert "platform plugin 'sloppy' (distribution fd-test-sloppy): hook device_memory built a bad record" in message
    assert "DeviceMemory.total_bytes='80GiB'" in message


def test_no_traceback_even_for_an_unexpected_error(monkeypatch) -> None:
    """The CLI's last line of defence: one line, and the traceback only with -v."""
    import fd_platforms.cli.list_command as c

    def boom(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(c, "run", boom)
    done = cli("list")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        "fd-platforms: internal error: ZeroDivisionError: a bug. This is a bug in fd-platforms; "
        "rerun with -v for the traceback and report it"
    )
    verbose = cli("-v", "list")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr
