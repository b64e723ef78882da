"""The porting guide is the real port: its blocks of FastDeploy's files run, on cpu, beside stand-ins of the rest
of FastDeploy's classes, and every line they add to FastDeploy's files is counted here; the guide states those
counts, and they keep within the issue's limits.

How a line is counted (the guide states the same rules): every non-blank line of a block headed by a FastDeploy
file (``# fastdeploy/...py``) is added, comments too, except a ``class`` line and its docstring, the ``def`` lines of
a function FastDeploy has at c1b7c083 with its parameters and return annotation (``fastdeploy_lines.json``: read
from gongshaotian/FastDeploy with ``ast``, each function's line range, signature and the hashes of its stripped lines), a line marked ``# unchanged`` (it must hash to a line of
that function) and a line marked ``# stands for:`` (it must be one call, to ``super()`` or to the stand-in's own
method or function, which runs the lines FastDeploy keeps there).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import fastdeploy_runner_standin
import pytest
from conftest import left_behind_by, run_tracked, shm_entries
from run_helpers import ROOT, clean_env

from fd_platforms.engine import KVCache, ManagedCache

GUIDE = ROOT / "docs" / "porting-fastdeploy.md"
FASTDEPLOY = json.loads((ROOT / "tests" / "support" / "fastdeploy_lines.json").read_text())
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEADER = re.compile(r"# (fastdeploy/[\w/]+\.py)\n")
UNCHANGED, STANDS_FOR = "# unchanged", "# stands for:"
LAUNCH_LINES = {"fastdeploy/cache_manager/prefix_cache_manager.py": 1}
"""Lines the port adds outside the blocks: ``launch_cache_messager`` passing ``--model_path`` (the guide shows it)."""
PARTS = {
    "GPU runner + MTP proposer": (
        ("fastdeploy/worker/gpu_model_runner.py", "fastdeploy/spec_decode/mtp.py", "fastdeploy/spec_decode/mtp_cuda.py"),
        30,
    ),
    "XPU runner": (("fastdeploy/worker/xpu_model_runner.py",), 15),
    "worker": (("fastdeploy/worker/gpu_worker.py", "fastdeploy/worker/worker_process.py"), None),
    "cache transfer manager": (("fastdeploy/cache_manager/cache_transfer_manager.py",), 30),
    "cache messager": (
        ("fastdeploy/cache_manager/cache_messager.py", "fastdeploy/cache_manager/prefix_cache_manager.py"),
        15,
    ),
}
"""Each part of the port, its FastDeploy files and the issue's limit on the lines it adds (issue 42)."""
ALLOWED_IMPORTS = ("fd_platforms", "fd_platforms.engine", "fd_platforms.fastdeploy", "fastdeploy_runner_standin")
"""What a ported file imports: the public modules, and FastDeploy's own (stood in: its ``current_platform``)."""


def guide_blocks() -> list[str]:
    return PYTHON.findall(GUIDE.read_text(encoding="utf-8"))


def fastdeploy_blocks() -> dict[str, str]:
    """The guide's blocks of FastDeploy's files, by file (a file's blocks joined)."""
    found: dict[str, str] = {}
    for block in guide_blocks():
        header = HEADER.match(block)
        if header:
            found[header.group(1)] = found.get(header.group(1), "") + block[header.end() :]
    return found


def functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """Every function of a block with FastDeploy's name for it (``Class.method`` or ``function``)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, ast.FunctionDef):
                    yield f"{node.name}.{child.name}", child
        elif isinstance(node, ast.FunctionDef):
            yield node.name, node


def signature(function: ast.FunctionDef) -> tuple[list[str], str | None]:
    """A function's parameter names and return annotation, as ``fastdeploy_lines.json`` holds FastDeploy's."""
    args = function.args
    names = [arg.arg for arg in (*args.posonlyargs, *args.args)] + ([f"*{args.vararg.arg}"] if args.vararg else [])
    names += [arg.arg for arg in args.kwonlyargs] + ([f"**{args.kwarg.arg}"] if args.kwarg else [])
    return names, None if function.returns is None else ast.unparse(function.returns)


def line_hash(line: str) -> str:
    return hashlib.sha256(line.strip().encode()).hexdigest()[:16]


def is_standin_call(line: str) -> bool:
    """One statement whose value is a call to ``super().x(...)``, or to a function or method the stand-in has."""
    statement = ast.parse(line.split(STANDS_FOR)[0].strip()).body
    if len(statement) != 1 or not isinstance(statement[0], (ast.Expr, ast.Assign, ast.Return)):
        return False
    call = statement[0].value
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and getattr(func.value.func, "id", "") == "super":
        return True
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    owners = [fastdeploy_runner_standin, *vars(fastdeploy_runner_standin).values()]
    return any(callable(getattr(owner, name, None)) for owner in owners if isinstance(owner, type) or owner is owners[0])


def added_lines(file: str, block: str) -> list[str]:
    """The lines ``block`` adds to FastDeploy's ``file`` (see the module docstring); an AssertionError for a marked
    line that is not what its mark says."""
    known = FASTDEPLOY["files"].get(file, {})
    tree = ast.parse(block)
    lines = block.splitlines()
    skipped: set[int] = set()
    owner: dict[int, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            body = node.body
            skipped.update(range(node.lineno, body[0].lineno))
            if ast.get_docstring(node) is not None:
                skipped.update(range(body[0].lineno, body[0].end_lineno + 1))  # type: ignore[operator]
    for name, function in functions(tree):
        for number in range(function.lineno, function.end_lineno + 1):  # type: ignore[operator]
            owner[number] = name
        if name in known and signature(function) == (known[name]["parameters"], known[name]["returns"]):
            skipped.update(range(function.lineno, function.body[0].lineno))  # FastDeploy's def, as it has it
    counted = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or number in skipped:
            continue
        if line.rstrip().endswith(UNCHANGED):
            function = owner.get(number)
            assert function in known, f"{file}: line {number} is marked unchanged outside a function of FastDeploy's"
            text = line.rsplit(UNCHANGED, 1)[0]
            assert line_hash(text) in known[function]["hashes"], f"{file} {function}: {text.strip()!r} is not its line"
            continue
        if STANDS_FOR in line:
            assert owner.get(number) in known, f"{file}: line {number} stands for lines of a function FastDeploy lacks"
            assert is_standin_call(line), f"{file}: line {number} stands for FastDeploy's lines but is no single call"
            continue
        counted.append(line)
    return counted


def counts() -> dict[str, int]:
    """Lines each part adds, from the guide's blocks and :data:`LAUNCH_LINES`."""
    blocks = fastdeploy_blocks()
    per_file = {file: len(added_lines(file, block)) for file, block in blocks.items()} | LAUNCH_LINES
    return {part: sum(per_file.get(file, 0) for file in files) for part, (files, _) in PARTS.items()}


def stated() -> dict[str, int]:
    """The counts the guide's table states: ``| part | files | **N** | limit |``."""
    rows = re.findall(r"^\| ([^|]+?) \| [^|]+ \| \*\*(\d+)\*\* \|", GUIDE.read_text(encoding="utf-8"), re.M)
    return {part: int(count) for part, count in rows}


def test_every_part_of_the_port_has_its_blocks_and_the_guide_states_each_count() -> None:
    blocks = fastdeploy_blocks()
    expected = {file for files, _ in PARTS.values() for file in files} - set(LAUNCH_LINES)
    assert set(blocks) == expected, "the guide's blocks of FastDeploy's files"
    assert stated() == counts()


@pytest.mark.parametrize("part", [part for part, (_, limit) in PARTS.items() if limit is not None])
def test_each_part_adds_no_more_lines_than_the_issue_allows(part: str) -> None:
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


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")
def test_the_guide_runs_on_cpu_as_one_session() -> None:
    """Every block in order, in a fresh interpreter from the repository root (as ``test_doc_samples.py`` runs the
    other guides; this one writes FastDeploy's record names, so under their lock), leaving nothing in /dev/shm."""
    before = shm_entries()
    env = {k: v for k, v in clean_env().items() if k != "FD_PLATFORM"}
    done, pids = run_tracked([sys.executable, "-c", "\n".join(guide_blocks())], cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not left_behind_by(pids, before)


# --- The port in the deployments the blockers were about: MTP ratio 2, several nodes, P/D decode with swap. ------


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
def test_p_d_decode_with_swap_space_the_messager_creates_and_both_attach(monkeypatch: pytest.MonkeyPatch) -> None:
    """FastDeploy's P/D decode with swap space: its messager creates, its worker attaches, and its transfer manager,
    started without ``--create_cache_tensor``, attaches too: the guide's transfer manager with ``attach=`` as
    FastDeploy decides it (``cache_transfer_manager.py`` ``_init_gpu_cache``: it creates only with the flag)."""
    port = ported()
    signals = [port["FastDeploySignal"].create(name, "8602", 1)  # type: ignore[attr-defined]
               for name in ("cache_ready_signal", "swap_space_ready_signal", "cache_transfer_inited_signal")]  # fmt: skip
    flags = ("--rank 0 --device_id 0 --mp_num 1 --num_layers 48 --splitwise_role decode --cache_dtype bfloat16 "
             "--key_cache_shape 40,4,64,128 --value_cache_shape 40,4,64,128 --engine_worker_queue_port 8602 "
             "--model_path examples/qwen3-30b-a3b").split()  # fmt: skip
    messager = runner = manager = None
    try:
        monkeypatch.setattr(sys, "argv", ["cache_messager.py", *flags, "--ipc_suffix", "8602"])
        port["args"] = port["parse_args"]()  # type: ignore[operator]
        messager = port["main"]()  # type: ignore[operator]
        config = port["fd_config"]("examples/qwen3-30b-a3b", splitwise_role="decode", swap_space=0.02, port="8602")  # type: ignore[operator]
        runner = port["GPUModelRunner"](config, "gpu:0", 0, rank=0, local_rank=0)  # type: ignore[operator]
        runner.update_share_input_block_num(40)
        manager_flags = [*flags, "--num_cpu_blocks", str(config.cache_config.num_cpu_blocks)]
        manager = port["CacheTransferManager"](fastdeploy_runner_standin.transfer_manager_parser().parse_args(manager_flags))  # type: ignore[operator]
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


def test_the_before_table_states_fastdeploys_functions_and_their_lines() -> None:
    """Each row of the first table is functions of FastDeploy's file at c1b7c083 and their physical lines; the
    guide's totals are the table's sum and the counted lines' sum."""
    text = GUIDE.read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([\w/]+\.py)` \| ([^|]+) \| (\d+) \|", text, re.M)
    assert len(rows) >= 10
    for file, names, lines in rows:
        known = FASTDEPLOY["files"][f"fastdeploy/{file}"]
        found = [key for name in re.findall(r"`([\w.]+)`", names) for key in known
                 if key == name or key.endswith(f".{name}")]  # fmt: skip
        assert found and sum(known[key]["physical"] for key in found) == int(lines), (file, names, lines)
    assert f"**{sum(int(lines) for _, _, lines in rows)} lines** at c1b7c083" in text
    assert f"**{sum(counts().values())} lines** added in FastDeploy's own files" in text


def test_the_stated_functions_are_fastdeploys() -> None:
    """The line ranges the counting trusts are FastDeploy's at the commit the guide names."""
    assert FASTDEPLOY["commit"].startswith("c1b7c083") and "c1b7c083" in GUIDE.read_text(encoding="utf-8")
    for file, found in FASTDEPLOY["files"].items():
        for function, facts in found.items():
            start, end = facts["lines"]
            assert facts["physical"] == end - start + 1 and facts["hashes"], (file, function)
    assert Path(fastdeploy_runner_standin.__file__).name == "fastdeploy_runner_standin.py"
