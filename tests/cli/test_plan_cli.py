"""``fd-platforms plan``: exact figures from the formulas, platform rows, config files, error paths."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from accelerator_host import host_command
from run_helpers import ROOT, SCRIPT, clean_env, main_in_process

from fd_platforms.loading.discovery import discover

GIB = 2**30
DONE_WHEN = [
    "--tp",
    "4",
    "--block-size",
    "64",
    "--device-memory",
    "80GiB",
    "--memory-utilization",
    "0.9",
    "--non-cache-memory",
    "20GiB",
    "--json",
]

# Bytes of one block per rank, written out from facts.md §2 for tp 4, block 64, bf16.
HAND_BYTES_PER_BLOCK = {
    "qwen3-30b-a3b": ("gqa", 2 * 2 * 64 * 128 * (4 // 4) * 48),
    "llama-3.1-8b": ("gqa", 2 * 2 * 64 * 128 * (8 // 4) * 32),
    "gemma-3-27b": ("gqa", 2 * 2 * 64 * 128 * (16 // 4) * 62),  # facts under text_config
    "llama-4-scout-17b-16e": ("gqa", 2 * 2 * 64 * 128 * (8 // 4) * 48),  # facts under text_config
    "deepseek-v3": ("mla", 2 * (512 + 64) * 64 * 61),
    "deepseek-v3.2": ("dsa", (512 + 512 // 128 * 4 + 2 * 64 + 128 + 128 // 128 * 4) * 64 * 61),
}


def plan(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms plan *args`` in this process, on the cpu platform (``FD_PLATFORM=cpu``) unless ``--platform``
    names one: the figures are this file's subject. (Left to select, it would screen every installed plugin in a
    child process first: the selection's subject, tests/loading/test_selection.py's and test_cli.py's.)"""
    if "--platform" not in args:
        env = {"FD_PLATFORM": "cpu", **env}
    return main_in_process("plan", *args, **env)


def plan_json(*args: str, **env: str) -> dict:
    result = plan(*args, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("model", HAND_BYTES_PER_BLOCK)
def test_exact_figures_for_each_example_model(model: str) -> None:
    attention, per_block = HAND_BYTES_PER_BLOCK[model]
    row = plan_json("--model", f"examples/{model}", *DONE_WHEN)
    budget = 80 * GIB * 9 // 10 - 20 * GIB
    assert (row["attention"], row["bytes_per_block"], row["budget_bytes"]) == (attention, per_block, budget)
    assert row["num_blocks"] == row["memory_blocks"] == budget // per_block
    assert row["tokens"] == row["num_blocks"] * 64
    assert (row["binding"], row["num_cpu_blocks"], row["create_cache_tensor"]) == ("memory", 0, True)
    assert row["platform"] == "cpu"


@pytest.mark.parametrize(("swap", "gib"), [("16", 16), ("16GiB", 16), ("1.5", 1.5)])
def test_a_bare_swap_space_is_gib_per_rank(swap: str, gib: float) -> None:
    row = plan_json(
        "--model", "examples/llama-3.1-8b", "--tp", "1", "--device-memory", "80GiB", "--swap-space", swap, "--json"
    )
    per_block = 2 * 2 * 64 * 128 * 8 * 32  # 8 MiB
    assert row["num_cpu_blocks"] == int(gib * GIB) // per_block
    assert swap != "16" or row["num_cpu_blocks"] == 2048


@pytest.mark.parametrize(
    ("model", "cache", "allocated", "dtypes"),
    [
        ("deepseek-v3.2", [], "uint8", {"key": "uint8", "indexer": "uint8"}),
        ("deepseek-v3.2", ["--cache-dtype", "fp8"], "uint8", {"key": "uint8", "indexer": "uint8"}),
        ("qwen3-30b-a3b", ["--cache-dtype", "fp8"], "uint8", {"key": "uint8", "value": "uint8"}),
        (
            "qwen3-30b-a3b",
            ["--cache-dtype", "fp8", "--kv-cache-quant-type", "block_wise_fp8"],
            "uint8",
            {"key": "uint8", "value": "uint8", "key_scale": "bfloat16", "value_scale": "bfloat16"},
        ),
        ("qwen3-30b-a3b", [], "bfloat16", {"key": "bfloat16", "value": "bfloat16"}),
    ],
)
def test_the_plan_reports_the_dtypes_tensors_are_allocated_in(
    model: str, cache: list[str], allocated: str, dtypes: dict[str, str]
) -> None:
    args = ["--model", f"examples/{model}", "--device-memory", "80GiB", *cache]
    row = plan_json(*args, "--json")
    assert (row["cache_dtype"], row["tensor_dtypes"]) == (allocated, dtypes)
    assert row["configured_cache_dtype"] == ("float8_e4m3fn" if cache else "bfloat16")
    line = next(line for line in plan(*args).stdout.splitlines() if line.startswith("cache dtype"))
    if model == "deepseek-v3.2":
        assert "DSA packs key and indexer as uint8; cache_dtype does not apply" in line
    elif cache:
        assert "float8_e4m3fn (allocated as " in line


def test_a_decimal_size_gets_a_note_with_its_binary_value() -> None:
    args = ("--model", "examples/llama-3.1-8b", "--device-memory", "80GB")
    row = plan_json(*args, "--json")
    assert row["device_memory"]["total_bytes"] == 80 * 10**9
    assert row["notes"] == ["80GB is 80000000000 bytes (powers of 1000) = 74.51 GiB; write 80GiB for powers of 1024"]
    table = plan(*args).stdout
    assert "74.51 GiB (80000000000 B) from --device-memory" in table and table.count("powers of 1000") == 1
    assert plan_json("--model", "examples/llama-3.1-8b", "--device-memory", "80GiB", "--json")["notes"] == []


def test_a_unit_letter_alone_is_refused_with_a_did_you_mean() -> None:
    result = plan("--model", "examples/llama-3.1-8b", "--device-memory", "80G")
    assert result.returncode == 2
    assert "did you mean 80GiB (powers of 1024) or 80GB (powers of 1000)?" in result.stderr


def test_the_plan_says_what_non_cache_memory_it_assumed() -> None:
    base = ("--model", "examples/llama-3.1-8b", "--device-memory", "80GiB")
    row = plan_json(*base, "--json")["device_memory"]
    assert row["non_cache_bytes"] == 0 and "weights and activations are not counted" in row["non_cache_source"]
    assert "pass --non-cache-memory SIZE" in row["non_cache_source"]
    line = next(line for line in plan(*base).stdout.splitlines() if line.startswith("non-cache memory"))
    assert "0 B: none given: weights and activations are not counted; pass --non-cache-memory SIZE" in line
    given = plan_json(*base, "--non-cache-memory", "20GiB", "--json")["device_memory"]
    assert (given["non_cache_bytes"], given["non_cache_source"]) == (20 * GIB, "--non-cache-memory")


def test_a_binding_limit_shows_what_memory_alone_would_allow() -> None:
    base = ("--model", "examples/llama-3.1-8b", "--device-memory", "80GiB")
    row = plan_json(*base, "--num-gpu-blocks-override", "10", "--json")
    assert (row["num_blocks"], row["binding"]) == (10, "override") and row["memory_blocks"] > 10
    table = plan(*base, "--num-gpu-blocks-override", "10").stdout
    assert f"10 (640 tokens); memory alone would allow {row['memory_blocks']}" in table
    assert "memory alone" not in plan(*base).stdout


@pytest.mark.parametrize(
    ("args", "decided_by", "outcome"),
    [
        ((), "rule: no cache manager needed", "yes"),
        (("--role", "decode"), "splitwise_role", "no, the worker attaches to the cache manager's"),
    ],
)
def test_the_decision_names_what_decided(args: tuple[str, ...], decided_by: str, outcome: str) -> None:
    base = ("--model", "examples/llama-3.1-8b", "--device-memory", "80GiB", *args)
    assert plan_json(*base, "--json")["decided_by"] == decided_by
    line = next(line for line in plan(*base).stdout.splitlines() if line.startswith("create cache"))
    assert line.split(None, 2)[2].startswith(f"{outcome} ({decided_by}: ") and "none" not in line.split("(")[1][:10]


def test_mtp_swap_space_and_role_change_the_plan() -> None:
    row = plan_json(
        "--model",
        "examples/deepseek-v3",
        "--mtp",
        "--device-memory",
        "141GiB",
        "--swap-space",
        "64GiB",
        "--host-memory",
        "2TiB",
        "--role",
        "decode",
        "--json",
    )
    per_block = 2 * 576 * 64 * (61 + 1)
    assert row["bytes_per_block"] == per_block and row["num_layers"] == 62
    assert row["num_cpu_blocks"] == 64 * GIB // per_block  # the same bytes per block as the device
    assert row["create_cache_tensor"] is False and row["decision_term"] == "num_cpu_blocks"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--swap-space", "999999TiB"), "swap_space='999999.00 TiB' is not valid; allowed: host swap space that fits"),
        (("--swap-space", "2GiB", "--host-memory", "1GiB"), "is more than the 1.00 GiB host memory given"),
    ],
)
def test_host_swap_beyond_the_hosts_memory_is_refused(args: tuple[str, ...], words: str) -> None:
    result = plan("--model", "examples/qwen3-30b-a3b", "--device-memory", "80GiB", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert words in line and "Fix: lower swap_space (it is per rank)" in line and "--host-memory SIZE" in line


def test_platform_all_gives_one_row_per_installed_platform() -> None:
    rows = plan_json(
        "--model",
        "examples/llama-3.1-8b",
        "--platform",
        "all",
        "--device-memory",
        "32GiB",
        "--storage-backend",
        "mooncake",
        "--json",
    )
    assert [r["platform"] for r in rows] == list(discover())  # in-repo and any installed vendor plugin
    assert {r["num_blocks"] for r in rows} == {32 * GIB * 9 // 10 // (2 * 2 * 64 * 128 * 8 * 32)}
    assert all(r["create_cache_tensor"] is False and r["decision_term"] == "storage_backend" for r in rows)
    table = plan("--model", "examples/llama-3.1-8b", "--platform", "all", "--device-memory", "32GiB")
    assert table.returncode == 0 and table.stdout.splitlines()[0].startswith("PLATFORM")
    plans, rule, shapes = table.stdout.split("\n\n")  # the plans, the rule version, where the shapes differ
    assert (
        rule
        == 'rule version 2026-01: profile or not (num_cpu_blocks > 0 or storage_backend or splitwise_role != "mixed")'
    )
    assert len(plans.splitlines()) == 1 + len(rows)
    metax = [line.split(maxsplit=1) for line in shapes.splitlines() if line.startswith("metax ")]
    assert metax == [["metax", "key [N, 64, 8, 128] bfloat16; value [N, 64, 8, 128] bfloat16"]]


def test_config_file_with_flags_winning_and_live_cpu_facts() -> None:
    row = plan_json("--config", "examples/deploy.toml", "--tp", "2", "--json")
    assert row["tensor_parallel_size"] == 2 and row["model"] == "qwen3-30b-a3b"
    assert row["device_memory"]["source"] == "/proc/meminfo, split evenly across 2 ranks sharing host memory"
    assert row["bytes_per_block"] == 2 * 2 * 64 * 128 * (4 // 2) * 48
    assert 0 < row["num_blocks"] * row["bytes_per_block"] <= row["budget_bytes"]


LIMITED_PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity, PlatformLimit

@hookimpl
def platform_identity():
    return PlatformIdentity("acme", "acme_npu", "ACME_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection(False, "no acme device here")

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def declared_limits():
    return (
        PlatformLimit("max_tensor_elements", 2**28 - 1, "acme kernels address at most 2**28 elements per cache tensor"),
    )
"""


def test_declared_limit_binds_with_its_reason(make_plugin) -> None:
    site = make_plugin("acme", source=LIMITED_PLUGIN)
    row = plan_json(
        "--model",
        "examples/llama-3.1-8b",
        "--platform",
        "acme",
        "--device-memory",
        "141GiB",
        "--block-size",
        "16",
        "--json",
        PYTHONPATH=str(site),
    )
    elements_per_block = 8 * 16 * 128  # one layer's key tensor at tp 1
    assert row["memory_blocks"] > (2**28 - 1) // elements_per_block
    assert row["num_blocks"] == (2**28 - 1) // elements_per_block
    assert (
        row["binding"] == "platform_limit"
        and "acme kernels address at most 2**28 elements per cache tensor" in row["binding_reason"]
    )
    assert row["limits"] == [
        {
            "kind": "max_tensor_elements",
            "value": 2**28 - 1,
            "reason": "acme kernels address at most 2**28 elements per cache tensor",
        }
    ]


def test_unavailable_platform_without_device_memory_says_to_pass_it() -> None:
    result = plan("--model", "examples/llama-3.1-8b", "--platform", "cuda")
    assert result.returncode == 2 and "pass --device-memory SIZE" in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--model", "examples/llama-3.1-8b", "--device-memory", "8GiB", "--non-cache-memory", "16GB"],
            "holds no block",
        ),
        (["--model", "examples/llama-3.1-8b", "--device-memory", "8GiX"], "--device-memory='8GiX'"),
        (
            ["--model", "examples/llama-3.1-8b", "--platform", "nosuch", "--device-memory", "8GiB"],
            "--platform='nosuch'",
        ),
        (["--model", "examples/llama-3.1-8b", "--platform", "all"], "--device-memory is not given"),
        (["--device-memory", "8GiB"], "--model is not given"),
        (["--model", "examples/no-such-model", "--device-memory", "8GiB"], "no-such-model"),
        (["--model", "examples/llama-3.1-8b", "--tp", "0", "--device-memory", "8GiB"], "--tp=0 is not valid"),
        (
            ["--model", "examples/llama-3.1-8b", "--memory-utilization", "1.5", "--device-memory", "8GiB"],
            "--memory-utilization=1.5 is not valid",
        ),
        (["--model", "examples/llama-3.1-8b", "--role", "both"], "invalid choice: 'both'"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], words: str) -> None:
    result = plan(*args)
    assert result.returncode == 2, result.stdout
    assert words in result.stderr and "Traceback" not in result.stderr
    if "invalid choice" not in words:
        assert len(result.stderr.strip().splitlines()) == 1 and "Fix:" in result.stderr


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_planning_with_given_memory_never_imports_paddle() -> None:
    code = (
        "import sys\nfrom fd_platforms.cli import main\n"
        "assert main(['plan', '--model', 'examples/deepseek-v3', '--device-memory', '80GiB', '--platform', 'all',"
        " '--json']) == 0\nassert 'paddle' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr


def test_bad_limit_record_and_broken_platform_are_named(make_plugin) -> None:
    site = make_plugin(
        "acme", source=LIMITED_PLUGIN.replace('PlatformLimit("max_tensor_elements"', '("max_tensor_elements"')
    )
    make_plugin("broken", source="raise ImportError('libbroken.so missing')\n")
    bad = plan(
        "--model", "examples/llama-3.1-8b", "--platform", "acme", "--device-memory", "8GiB", PYTHONPATH=str(site)
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "'acme' (distribution fd-test-acme)" in bad.stderr and "must return PlatformLimit" in bad.stderr
    broken = plan(
        "--model", "examples/llama-3.1-8b", "--platform", "broken", "--device-memory", "8GiB", PYTHONPATH=str(site)
    )
    assert broken.returncode == 2 and "libbroken.so missing" in broken.stderr and "fd-test-broken" in broken.stderr


@pytest.mark.parametrize(
    "flags",
    [("--swap-space", "256MiB"), ("--role", "decode")],
    ids=["swap space", "P/D"],
)
def test_plan_says_what_run_does_on_a_platform_that_cannot_share(make_plugin, flags: tuple[str, ...]) -> None:
    """A platform available here that declares no cache sharing (as dcu, gcu, intel_hpu and npu do): run refuses
    before any process starts, and plan says so in the same words, and marks it in --platform all."""
    make_plugin("acme")
    common = ("--model", "examples/qwen3-30b-a3b", "--device-memory", "8GiB", *flags)
    planned = main_in_process("plan", *common, "--platform", "acme", "--json")
    assert planned.returncode == 0, planned.stderr
    row = json.loads(planned.stdout)
    assert row["runs"] is False and "platform acme cannot share KV cache tensors" in row["run_refusal"]
    ran = main_in_process("run", *common, "--platform", "acme")
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == f"fd-platforms: error: {row['run_refusal']}"
    table = main_in_process("plan", *common, "--platform", "all")
    assert re.search(r"^acme .* no: cannot share here ", table.stdout, re.MULTILINE), table.stdout
    assert re.search(r"^cpu .* yes ", table.stdout, re.MULTILINE), table.stdout


@pytest.mark.slow  # three console scripts on a Python without Paddle
def test_without_paddle_run_is_refused_before_any_process_starts_and_plan_says_so() -> None:
    """A core-only install (no Paddle): run names the missing Paddle and its fix before a worker starts (it was
    ``rank 0: ModuleNotFoundError: No module named 'paddle'`` once two workers had started), and plan agrees."""
    common = ("--model", "examples/qwen3-30b-a3b", "--tp", "2", "--device-memory", "1GiB")
    planned = without_paddle("plan", *common, "--json")
    assert planned.returncode == 0, planned.stderr
    row = json.loads(planned.stdout)
    assert row["runs"] is False and row["run_refused_because"] == "no Paddle here"
    assert (
        "needs PaddlePaddle, which is not installed here. Fix: pip install 'fd-platforms[paddle]'" in row["run_refusal"]
    )
    ran = without_paddle("run", *common)
    assert ran.returncode == 2 and ran.stderr.splitlines()[-1] == f"fd-platforms: error: {row['run_refusal']}"
    assert "started" not in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    table = without_paddle("plan", *common, "--platform", "all")
    assert re.search(r"^cpu .* no: no Paddle here ", table.stdout, re.MULTILINE), table.stdout + table.stderr


def without_paddle(*argv: str) -> subprocess.CompletedProcess[str]:
    """``fd-platforms *argv`` as the console script on a Python where ``import paddle`` finds nothing."""
    command, env = host_command([SCRIPT, *argv], paddle=False)
    return subprocess.run(command, capture_output=True, text=True, env=clean_env(**env), cwd=ROOT, timeout=120)


def test_every_size_flag_counts_a_number_alone_in_gib_as_swap_space_does() -> None:
    """--device-memory 80 and --swap-space 80 mean the same unit: GiB, as FastDeploy's and vLLM's swap_space."""
    row = plan_json(
        "--model",
        "examples/qwen3-30b-a3b",
        "--device-memory",
        "80",
        "--non-cache-memory",
        "1",
        "--swap-space",
        "2",
        "--host-memory",
        "64",
        "--json",
    )
    assert row["device_memory"]["total_bytes"] == 80 * 2**30
    assert row["device_memory"]["non_cache_bytes"] == 2**30
    assert row["num_cpu_blocks"] == 2 * 2**30 // row["bytes_per_block"]
    refused = plan("--model", "examples/qwen3-30b-a3b", "--device-memory", "80x")
    assert refused.returncode == 2 and "a number alone counts in GiB" in refused.stderr
    assert "85899345920B (a number alone is GiB)" in refused.stderr
