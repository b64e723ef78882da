"""The porting guide applied to a FastDeploy checkout: each block of a FastDeploy file (``docs/porting-fastdeploy.md``)
spliced into that file, then FastDeploy's own hooks run (black, isort, ruff's fixes), and every non-blank line the
diff adds counted.

How a block's function goes into FastDeploy's function of the same name (``Class.method`` or ``function``), line
by line:

- a line marked ``# unchanged`` is FastDeploy's line: the next line of its function with that text (FastDeploy's
  lines before it that no ``# stands for:`` keeps are deleted);
- a line marked ``# stands for: ...`` keeps FastDeploy's lines in its place: from ``from `text``` (default: where
  the function stands) to ``to `text``` (inclusive) or ``before `text``` (default: the next ``# unchanged`` line,
  or the function's end);
- any other line is the port's, written where it stands;
- FastDeploy's ``def`` line and docstring stay, unless the block's ``def`` differs from FastDeploy's: then the block's
  is written. A function FastDeploy lacks is added at the end of its class (or module).

A top-level ``from fd_platforms...`` import is added after FastDeploy's imports; an import of the stand-in is
FastDeploy's own where its comment says ``# FastDeploy: from ... import ...``, added only where the file lacks it.
Run as ``python tests/support/port_splice.py FASTDEPLOY_TREE [--with-8046] [--json]``: the tree must be a clean git
work tree (its diff is what is counted); it prints the added lines per file.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fastdeploy_pr_8046 import apply_hunks
from port_lines import LAUNCH_FLAG, STANDS_FOR, TEST_HEADER, UNCHANGED, fastdeploy_blocks, signature

FASTDEPLOY_IMPORT = re.compile(r"#\s*FastDeploy:\s*(from \S+ import .+)$")
KEEP_FROM, KEEP_TO, KEEP_BEFORE = (re.compile(rf"\b{word} `([^`]+)`") for word in ("from", "to", "before"))


class SpliceError(AssertionError):
    """The block does not fit FastDeploy's file: names the file, the function and the line."""


@dataclass
class _Source:
    lines: list[str]
    tree: ast.Module

    @classmethod
    def of(cls, text: str) -> _Source:
        return cls(text.splitlines(), ast.parse(text))


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[f"{node.name}.{child.name}"] = child
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found[node.name] = node
    return found


def _body_start(function: ast.FunctionDef | ast.AsyncFunctionDef, skip_docstring: bool) -> int:
    """The 0-based line where the function's body begins: its first statement's line, or the line after its
    docstring (comments there are the body's)."""
    first = function.body[0]
    if skip_docstring and ast.get_docstring(function) is not None:
        return first.end_lineno or first.lineno
    return first.lineno - 1


def _find(lines: list[str], start: int, end: int, text: str, where: str) -> int:
    for index in range(start, end):
        if lines[index].strip() == text.strip():
            return index
    raise SpliceError(f"{where}: FastDeploy's line {text.strip()!r} is not there (after its line {start + 1})")


def merge(original: list[str], start: int, end: int, block: list[str], where: str) -> list[str]:
    """FastDeploy's body ``original[start:end]`` with the block's body ``block`` spliced in (the module docstring's
    rules)."""
    out: list[str] = []
    cursor = 0 + start
    keeping: bool = False  # a stands-for line keeps FastDeploy's lines up to the next unchanged one
    pending: list[str] = []  # the port's lines written after that kept run
    for line in block:
        text = line.rstrip()
        if not text.strip():
            (pending if keeping else out).append("")
            continue
        if text.endswith(UNCHANGED):
            own = text[: -len(UNCHANGED)].rstrip()
            found = _find(original, cursor, end, own, where)
            if keeping:
                out.extend(original[cursor:found])
                out.extend(pending)
                keeping, pending = False, []
            out.append(original[found])
            cursor = found + 1
            continue
        if STANDS_FOR in text:
            if keeping:
                raise SpliceError(f"{where}: two stands-for lines with no unchanged line between them")
            comment = text.split(STANDS_FOR, 1)[1]
            first, last, before = (keep.search(comment) for keep in (KEEP_FROM, KEEP_TO, KEEP_BEFORE))
            if first:
                cursor = _find(original, cursor, end, first.group(1), where)
            if last or before:
                stop = _find(original, cursor, end, (last or before).group(1), where) + (1 if last else 0)  # type: ignore[union-attr]
                out.extend(original[cursor:stop])
                cursor = stop
            else:
                keeping = True
            continue
        (pending if keeping else out).append(text)
    if keeping:
        out.extend(original[cursor:end])
        out.extend(pending)
    while out and not out[-1].strip():
        out.pop()
    return out


def _signature_lines(source: list[str], function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    return source[function.lineno - 1 : function.body[0].lineno - 1]


def _imports(block_tree: ast.Module, block: list[str], target: _Source) -> list[str]:
    """The import lines the block adds to FastDeploy's file."""
    have = {
        alias.asname or alias.name
        for node in target.tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    added: list[str] = []
    for node in block_tree.body:
        if not isinstance(node, ast.ImportFrom):
            continue
        text = block[node.lineno - 1 : node.end_lineno]  # type: ignore[misc]
        if (node.module or "").startswith("fd_platforms"):
            added.extend(text)
            continue
        theirs = FASTDEPLOY_IMPORT.search(text[-1])
        if theirs is None:
            raise SpliceError(f"an import of {node.module} with no '# FastDeploy: from ... import ...' of its own")
        names = {alias.asname or alias.name for alias in node.names}
        if not names <= have:
            added.append(theirs.group(1))
    return added


def splice(file: str, original_text: str, block_text: str) -> str:
    """FastDeploy's ``file`` with the guide's block for it spliced in."""
    target = _Source.of(original_text)
    block = block_text.splitlines()
    block_tree = ast.parse(block_text)
    theirs = _functions(target.tree)
    edits: list[tuple[int, int, list[str]]] = []  # (start, end, replacement) on FastDeploy's lines, 0-based
    appended: dict[int, list[str]] = {}
    for name, function in _functions(block_tree).items():
        where = f"{file} {name}"
        ours_def = _signature_lines(block, function)
        body_from = _body_start(function, skip_docstring=True)
        our_body = block[body_from : function.end_lineno]
        if name in theirs:
            fd = theirs[name]
            keep_def = signature(function) == signature(fd)  # names and return annotation; its own defaults stay
            start = _body_start(fd, skip_docstring=keep_def)
            merged = merge(target.lines, start, fd.end_lineno or start, our_body, where)  # type: ignore[arg-type]
            if keep_def:
                edits.append((start, fd.end_lineno or start, merged))
            else:
                edits.append((fd.lineno - 1, fd.end_lineno or start, ours_def + merged))
            continue
        owner = name.split(".")[0] if "." in name else None
        if owner is None:
            appended.setdefault(len(target.lines), []).extend(["", "", *ours_def, *our_body])
            continue
        cls = next((n for n in target.tree.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            raise SpliceError(f"{where}: FastDeploy's file has no class {owner}")
        appended.setdefault(cls.end_lineno or 0, []).extend(["", *ours_def, *our_body])
    lines = list(target.lines)
    for end, added in sorted(appended.items(), reverse=True):
        lines[end:end] = added
    for start, end, replacement in sorted(edits, reverse=True):
        if any(start < at < end for at in appended):
            raise SpliceError(f"{file}: a method added inside a function the port rewrites")
        lines[start:end] = replacement
    imports = [node for node in target.tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    after = max(node.end_lineno or 0 for node in imports) if imports else 0
    lines[after:after] = _imports(block_tree, block, target)
    return "\n".join(lines) + "\n"


def add_launch_flag(text: str) -> str:
    """``launch_cache_messager`` passing ``--model_path`` (:data:`LAUNCH_FLAG`)."""
    _, name, follows, flag = LAUNCH_FLAG
    source = _Source.of(text)
    function = _functions(source.tree)[name]
    at = _find(source.lines, function.lineno, function.end_lineno or 0, follows, name)
    indent = source.lines[at][: len(source.lines[at]) - len(source.lines[at].lstrip())]
    source.lines.insert(at + 1, indent + flag)
    return "\n".join(source.lines) + "\n"


def pinned(block: str, rule: str | None) -> str:
    """The block with ``rule`` pinned in place of ``FASTDEPLOY_RULE`` (a FastDeploy with PR #8046 pins
    ``2026-06``), its import dropped; None: as the guide writes it."""
    if rule is None:
        return block
    block = block.replace("rule=FASTDEPLOY_RULE", f"rule={rule!r}".replace("'", '"'))
    return re.sub(r"FASTDEPLOY_RULE,\s*", "", block)


def apply(tree: Path, rule: str | None = None) -> list[str]:
    """Splice every block into the FastDeploy work tree ``tree`` (pinning ``rule``, :func:`pinned`); the files
    changed."""
    changed = []
    for file, written in (fastdeploy_blocks() | fastdeploy_blocks(TEST_HEADER)).items():
        path = tree / file
        path.write_text(splice(file, path.read_text(encoding="utf-8"), pinned(written, rule)), encoding="utf-8")
        changed.append(file)
    launch = tree / LAUNCH_FLAG[0]
    launch.write_text(add_launch_flag(launch.read_text(encoding="utf-8")), encoding="utf-8")
    return [*changed, LAUNCH_FLAG[0]]


def format_as_fastdeploy(tree: Path, files: list[str], python: str) -> None:
    """FastDeploy's pre-commit hooks that change ``files``, in its order and with its own settings
    (``.pre-commit-config.yaml``, ``pyproject.toml``): black, isort, and ruff's fixes of unused imports."""
    subprocess.run([python, "-m", "black", "-q", *files], cwd=tree, check=True)
    subprocess.run([python, "-m", "isort", "-q", *files], cwd=tree, check=True)
    fix = [python, "-m", "ruff", "check", "-q", "--fix", "--select", "F401", "--config", "pyproject.toml", *files]
    subprocess.run(fix, cwd=tree, check=True)  # its ruff hook (--fix): the imports the port leaves unused go
    subprocess.run([python, "-m", "black", "-q", *files], cwd=tree, check=True)  # pre-commit's second run: clean
    subprocess.run([python, "-m", "isort", "-q", *files], cwd=tree, check=True)


def added_per_file(tree: Path) -> dict[str, int]:
    """Non-blank lines the work tree's diff adds, per file."""
    diff = subprocess.run(["git", "diff", "-U0", "--no-color"], cwd=tree, check=True, capture_output=True, text=True)
    counts: dict[str, int] = {}
    file = ""
    for line in diff.stdout.splitlines():
        if line.startswith("+++ "):
            file = line[6:] if line.startswith("+++ b/") else ""
        elif line.startswith("+") and file and line[1:].strip():
            counts[file] = counts.get(file, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="a FastDeploy git work tree, clean, at the commit to port")
    parser.add_argument("--python", default=sys.executable, help="a Python with isort and black (FastDeploy's pins)")
    parser.add_argument("--no-apply", action="store_true", help="count the tree's diff as it stands")
    parser.add_argument(
        "--with-8046",
        action="store_true",
        help="first make PR #8046's changes by hand (PR_8046) and commit them in the tree; the port pins 2026-06",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=args.tree,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    if dirty and not args.no_apply:
        parser.error(f"{args.tree} has changes of its own ({dirty.split()[-1]}, ...): port a clean work tree")
    if args.with_8046:
        files = apply_hunks(args.tree)
        subprocess.run(
            ["git", "commit", "-q", "-m", "PR #8046 by hand (fd-platforms port_splice.py)", *files],
            cwd=args.tree,
            check=True,
        )
    if not args.no_apply:
        format_as_fastdeploy(args.tree, apply(args.tree, "2026-06" if args.with_8046 else None), args.python)
    counts = added_per_file(args.tree)
    if args.json:
        base = "HEAD~1" if args.with_8046 else "HEAD"  # the commit the port's base stands on
        commit = subprocess.run(["git", "rev-parse", base], cwd=args.tree, check=True, capture_output=True, text=True)
        hooks = subprocess.run(
            [args.python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True
        ).stdout.split()
        record = {
            "fastdeploy": commit.stdout.strip(),
            "with_8046": args.with_8046,
            "hooks": sorted(line for line in hooks if line.split("==")[0] in ("black", "isort", "ruff")),
            "files": {file: count for file, count in counts.items() if not file.startswith("tests/")},
            "tests": {file: count for file, count in counts.items() if file.startswith("tests/")},
        }
        record["total"], record["tests_total"] = sum(record["files"].values()), sum(record["tests"].values())
        print(json.dumps(record, indent=1))
    else:
        for file, count in sorted(counts.items()):
            print(f"{count:4d}  {file}")
        print(f"{sum(counts.values()):4d}  in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
