"""Counting the lines the porting guide (``docs/porting-fastdeploy.md``) adds to FastDeploy's files.

Every non-blank line of a block headed by a FastDeploy file (``# fastdeploy/...py``) is added, comments too, except a
``class`` line and its docstring, the ``def`` lines of a function FastDeploy has at c1b7c083 with its parameters and
return annotation (``fastdeploy_lines.json``: read from gongshaotian/FastDeploy with ``ast``, each function's line
range, signature and the hashes of its stripped lines), a line marked ``# unchanged`` (it must hash to a line of that
function) and a line marked ``# stands for:`` (it must be one call, to ``super()`` or to the stand-in's own method or
function, which runs the lines FastDeploy keeps there). The guide states the same rules.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterator

import fastdeploy_runner_standin
from run_helpers import ROOT

GUIDE = ROOT / "docs" / "porting-fastdeploy.md"
FASTDEPLOY = json.loads((ROOT / "tests" / "support" / "fastdeploy_lines.json").read_text())
PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
HEADER = re.compile(r"# (fastdeploy/[\w/]+\.py)\n")
TEST_HEADER = re.compile(r"# (tests/[\w/]+\.py)\n")
UNCHANGED, STANDS_FOR = "# unchanged", "# stands for:"
LAUNCH_FLAG = (
    "fastdeploy/cache_manager/prefix_cache_manager.py",
    "PrefixCacheManager.launch_cache_messager",
    '+ f" --ipc_suffix {ipc_suffix}"',
    '+ f" --model_path {self.config.model_config.model}"',
)
"""The one line the port adds outside its blocks (the messager's ``--model_path``): file, function, the line it
follows, the line."""
LAUNCH_LINES = {LAUNCH_FLAG[0]: 1}
"""Lines the port adds outside the blocks, by file (the guide shows it)."""


PARTS = {
    "GPU runner + MTP proposer": (
        (
            "fastdeploy/worker/gpu_model_runner.py",
            "fastdeploy/spec_decode/mtp.py",
            "fastdeploy/spec_decode/mtp_cuda.py",
        ),
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
"""Each part of the port, its FastDeploy files and the most lines it may add to them (None: no limit)."""


def guide_blocks() -> list[str]:
    return PYTHON.findall(GUIDE.read_text(encoding="utf-8"))


def fastdeploy_blocks(header_pattern: re.Pattern[str] = HEADER) -> dict[str, str]:
    """The guide's blocks of FastDeploy's files, by file (a file's blocks joined); with
    :data:`TEST_HEADER`, its blocks of FastDeploy's test files."""
    found: dict[str, str] = {}
    for block in guide_blocks():
        header = header_pattern.match(block)
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
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Call)
        and getattr(func.value.func, "id", "") == "super"
    ):
        return True
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    owners = [fastdeploy_runner_standin, *vars(fastdeploy_runner_standin).values()]
    return any(
        callable(getattr(owner, name, None)) for owner in owners if isinstance(owner, type) or owner is owners[0]
    )


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


def stated(column: int = 0) -> dict[str, int]:
    """The counts the guide's table states: ``| part | files | **N** | M | limit |``, N (``column=0``: the
    blocks' lines) or M (``column=1``: after FastDeploy's hooks)."""
    rows = re.findall(r"^\| ([^|]+?) \| [^|]+ \| \*\*(\d+)\*\* \| (\d+) \|", GUIDE.read_text(encoding="utf-8"), re.M)
    return {row[0]: int(row[1 + column]) for row in rows}
