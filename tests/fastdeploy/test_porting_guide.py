"""The porting guide is the real port: its blocks of FastDeploy's files (``docs/porting-fastdeploy.md``) run on cpu
beside stand-ins of the rest of FastDeploy's classes, name no module FastDeploy lacks, import only the public modules,
and each part adds no more lines to FastDeploy's files than its limit; the counting rules hold
(:mod:`port_lines`, which the guide states too). The guide's blocks run in order as one session in
``tests/docs/test_doc_samples.py``, and the counts it states are checked in ``tests/docs/test_docs_numbers.py``.
"""

from __future__ import annotations

import ast
import contextlib
import os
import sys
from pathlib import Path

import fastdeploy_runner_standin
import pytest
from port_lines import (
    FASTDEPLOY,
    GUIDE,
    HEADER,
    LAUNCH_LINES,
    PARTS,
    added_lines,
    counts,
    fastdeploy_blocks,
    guide_blocks,
)

from fd_platforms.engine import KVCache, ManagedCache

ALLOWED_IMPORTS = ("fd_platforms", "fd_platforms.engine", "fd_platforms.fastdeploy", "fastdeploy_runner_standin")
"""What a ported file imports: the public modules, and FastDeploy's own (stood in: its ``current_platform``)."""


def test_every_part_of_the_port_has_its_blocks() -> None:
    expected = {file for files, _ in PARTS.values() for file in files} - set(LAUNCH_LINES)
    assert set(fastdeploy_blocks()) == expected, "the guide's blocks of FastDeploy's files"


@pytest.mark.parametrize("part", [part for part, (_, limit) in PARTS.items() if limit is not None])
def test_each_part_adds_no_more_lines_than_its_limit(part: str) -> None:
    assert counts()[part] <= PARTS[part][1], (part, counts()[part])


def test_fastdeploy_writes_no_module_of_its_own_and_its_files_import_only_the_public_modules() -> None:
    """Every block names a file FastDeploy has (no helper module beside them), and imports only what a port may."""
    for file, block in fastdeploy_blocks().items():
        assert file in FASTDEPLOY["files"], f"{file} is no file of FastDeploy's the guide read"
        for node in ast.parse(block).body:
            if isinstance(node, ast.ImportFrom):
                assert node.module in ALLOWED_IMPORTS, (file, node.module)
            assert not isinstance(node, ast.Import), (file, ast.unparse(node))


def test_a_marked_line_must_be_what_its_mark_says() -> None:
    """The counting rules hold: a line of ours marked unchanged, or a stand-for line that is more than one call,
    is refused; FastDeploy's own line and a call to the stand-in are not counted."""

    def body(*lines: str) -> str:
        return "class GPUModelRunner:\n    def clear_cache(self, profile=False):\n" + "".join(
            f"        {line}\n" for line in lines
        )

    gpu = "fastdeploy/worker/gpu_model_runner.py"
    assert added_lines(gpu, body('self.share_inputs.pop("caches", None)  # unchanged', "x = 1")) == ["        x = 1"]
    with pytest.raises(AssertionError, match="is not its line"):
        added_lines(gpu, body("self.kv_cache.clear(strict=False)  # unchanged"))
    assert added_lines(gpu, body("super().clear_cache()  # stands for: its body")) == []
    with pytest.raises(AssertionError, match="no single call"):
        added_lines(gpu, body("x = compute() + 1  # stands for: its body"))
    assert len(added_lines(gpu, "class GPUModelRunner:\n    def plan(self):\n        return 1\n")) == 2  # a new method
    changed = "class GPUModelRunner:\n    def clear_cache(self, profile, now):\n        pass\n"
    assert len(added_lines(gpu, changed)) == 2  # a def whose parameters FastDeploy's lacks is a changed line


# --- The port in the deployments beyond the plain path: MTP ratio 2, several nodes, P/D decode with swap. -------------


def let_go(*parts: object) -> None:
    """What a test that stopped half-way made, let go (its runners and proposers, a transfer manager, a messager's
    cache), so a test that fails half-way leaves no published record to the modules after it."""
    fastdeploy_runner_standin.MESSAGERS.clear()
    for part in parts:
        for inputs in ("share_inputs", "model_inputs"):
            getattr(part, inputs, {}).pop("caches", None)
        if hasattr(part, "_drop_gpu_views") and hasattr(part, "gpu_cache_kvs"):
            part._drop_gpu_views()
        cache = getattr(part, "kv_cache", None) or getattr(part, "managed", None) or part
        with contextlib.suppress(Exception):  # best effort: the test's own failure is what it reports
            if isinstance(cache, KVCache):
                cache.clear(strict=False)
            elif isinstance(cache, ManagedCache):
                cache.clear(timeout=5, clear_host=True)


def ported(**names: object) -> dict[str, object]:
    """The guide's set-up and FastDeploy files' blocks (no driver), run in one namespace here."""
    namespace: dict[str, object] = {"__name__": "ported", **names}
    for block in guide_blocks():
        if HEADER.match(block) or "sys.path.insert" in block:
            exec(compile(block, str(GUIDE), "exec"), namespace)  # the guide's own code
    namespace["fastdeploy"].MTP_PROPOSERS["gpu"] = namespace["MTPProposerCUDA"]  # type: ignore[attr-defined]
    return namespace


@pytest.mark.usefixtures("fastdeploy_record_names")
def test_the_ported_runner_and_proposer_with_mtp_ratio_2() -> None:
    port = ported()
    config = port["fd_config"]("examples/qwen3-30b-a3b", mtp=True, port="8402", engine_pid=8400)  # type: ignore[operator]
    config.speculative_config.num_gpu_block_expand_ratio = 2
    signal = port["FastDeploySignal"].create("cache_ready_signal", "8402", 1)  # type: ignore[attr-defined]
    runner = port["GPUModelRunner"](config, "gpu:0", 0, rank=0, local_rank=0)  # type: ignore[operator]
    runner.load_model()
    try:
        runner.update_share_input_block_num(10)
        assert runner.proposer.kv_cache.tensors[0].shape[0] == 20 and signal.values() == (1,)
        runner.proposer.clear_mtp_cache()
        runner.clear_cache()
    finally:
        let_go(runner.proposer, runner)
        signal.close()


def test_the_ported_runner_of_global_rank_9_on_the_second_node() -> None:
    """tp8 x dp2 over two nodes: the worker of global rank 9 sees its node's eight devices (CUDA_VISIBLE_DEVICES)
    and names its tensors after device_ids[9 % 8] (``gpu_worker.py`` ``init_device``)."""
    port = ported()
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(device) for device in range(8))
    try:
        config = port["fd_config"]("examples/qwen3-30b-a3b", tp=8, dp=2, local_rank=9, port="8502,8503")  # type: ignore[operator]
    finally:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    runner = port["GPUModelRunner"](config, "gpu:1", 1, rank=16, local_rank=9)  # type: ignore[operator]
    layout = runner.kv.layout()
    assert (layout.local_device, layout.names()[0]) == (1, "key_caches_0_rank1.device1")


@pytest.mark.usefixtures("fastdeploy_record_names")
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_p_d_decode_with_swap_space_the_messager_creates_and_both_attach(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastDeploy's P/D decode with swap space: its messager creates, its worker attaches, and its transfer manager,
    started without ``--create_cache_tensor``, attaches too: the guide's transfer manager with ``attach=`` as
    FastDeploy decides it (``cache_transfer_manager.py`` ``_init_gpu_cache``: it creates only with the flag)."""
    port = ported()
    signals = [
        port["FastDeploySignal"].create(name, "8602", 1)  # type: ignore[attr-defined]
        for name in ("cache_ready_signal", "swap_space_ready_signal", "cache_transfer_inited_signal")
    ]
    flags = [
        "--rank",
        "0",
        "--device_id",
        "0",
        "--mp_num",
        "1",
        "--num_layers",
        "48",
        "--splitwise_role",
        "decode",
        "--cache_dtype",
        "bfloat16",
        "--key_cache_shape",
        "40,4,64,128",
        "--value_cache_shape",
        "40,4,64,128",
        "--engine_worker_queue_port",
        "8602",
        "--model_path",
        "examples/qwen3-30b-a3b",
    ]
    messager = runner = manager = None
    try:
        monkeypatch.setattr(sys, "argv", ["cache_messager.py", *flags, "--ipc_suffix", "8602"])
        port["args"] = port["parse_args"]()  # type: ignore[operator]
        messager = port["main"]()  # type: ignore[operator]
        config = port["fd_config"]("examples/qwen3-30b-a3b", splitwise_role="decode", swap_space=0.02, port="8602")  # type: ignore[operator]
        runner = port["GPUModelRunner"](config, "gpu:0", 0, rank=0, local_rank=0)  # type: ignore[operator]
        runner.update_share_input_block_num(40)
        manager_flags = [*flags, "--num_cpu_blocks", str(config.cache_config.num_cpu_blocks)]
        manager = port["CacheTransferManager"](
            fastdeploy_runner_standin.transfer_manager_parser().parse_args(manager_flags)
        )  # type: ignore[operator]
        assert messager.created and not runner.kv_cache.created and not manager.managed.created
        manager._clear_gpu_cache()
        runner.clear_cache()
        fastdeploy_runner_standin.MESSAGERS.clear()
        messager.clear()
        manager._clear_cpu_cache()  # its swap views go before the host cache they view
        manager.kept_host.clear()
    finally:
        let_go(manager, getattr(runner, "proposer", None), runner, messager)
        for signal in signals:
            signal.close()


def test_the_stated_functions_are_fastdeploys() -> None:
    """The line ranges the counting trusts are FastDeploy's at the commit the guide names."""
    assert FASTDEPLOY["commit"].startswith("c1b7c083") and "c1b7c083" in GUIDE.read_text(encoding="utf-8")
    for file, found in FASTDEPLOY["files"].items():
        for function, facts in found.items():
            start, end = facts["lines"]
            assert facts["physical"] == end - start + 1 and facts["hashes"], (file, function)
    assert Path(fastdeploy_runner_standin.__file__).name == "fastdeploy_runner_standin.py"
