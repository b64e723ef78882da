"""Every code sample in the README and ``docs/`` runs, so none can drift from the code.

- ``python`` blocks of a file run in order as one session (a later block uses what an earlier
  one made), from the repository root, in a fresh interpreter, each compiled under the file's
  name and its own line numbers (a traceback names the doc's line); a block made only of ``def``
  lines is a hook signature and must be the hook spec's own. A block fenced as a file of its own
  (```` ```python title="two_processes.py" ````) is no part of the session: the engine guide's
  two-process sample, which ``test_guide_two_process_sample.py`` runs as its own processes. The guides
  that write FastDeploy's record names (the engine guide, the porting guide) run under their lock, as
  every file does here.
- ``bash`` blocks: ``docs/multinode.md``'s commands for two machines, run together by ``test_multinode.py``.
- ``sh`` blocks: every ``fd-platforms`` command runs and exits 0 (the fake runtime a line builds
  with ``tools/fake-custom-device/build.sh`` is the session's built one); the set-up commands at
  the README's top are what CI runs.
- The README stays a few screens long, and every relative link in the README and ``docs/`` names a
  file that exists and, after ``#``, one of its headings.
- Inline calls such as ``platform.max_num_blocks(layout=layout, cache=cache)`` or the engine API's
  ``initialize_kv_cache(platform, layout, ...)`` in prose bind to the
  real signature (a call the docs show must not be a ``TypeError``).
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import left_behind_by, run_tracked, shm_entries
from run_helpers import ROOT, SCRIPT, clean_env

from fd_platforms import engine
from fd_platforms.contract import hookspecs
from fd_platforms.loading.platform import Platform

DOCS = (ROOT / "README.md", ROOT / "PYPI.md", *sorted((ROOT / "docs").glob("*.md")))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
FILE_FENCE = re.compile(r'^```python title="([\w.]+)"\n', re.M)  # a python block that is a file of its own
SIGNATURE = re.compile(r"def (\w+)\((.*)\) -> (.+)")
INLINE_CALL = re.compile(r"`(?:(platform|fd_platforms)\.)?(\w+)\(([^`]*)\)`")
SETUP = ("python3 -m venv", "pip install", "pytest")  # CI's own commands, or a plugin author's in their folder


def blocks(path: Path, language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(path.read_text()) if lang == language]


def is_signature(block: str) -> bool:
    lines = [line for line in block.splitlines() if line.strip()]
    return bool(lines) and all(SIGNATURE.fullmatch(line) for line in lines)


def python_samples(path: Path) -> list[tuple[int, str]]:
    """(the line it starts on, its code) of each ``python`` block of ``path`` that is part of its session: neither a
    hook signature nor a file of its own (``FILE_FENCE``)."""
    text = path.read_text(encoding="utf-8")
    found = [
        (text.count("\n", 0, match.start(2)) + 1, match.group(2), FILE_FENCE.match(match.group(0)) is not None)
        for match in FENCE.finditer(text)
        if match.group(1) == "python"
    ]
    assert len(found) == text.count("```python"), f"every ```python block of {path.name} is found (none skipped)"
    return [(line, code) for line, code, own_file in found if not own_file and not is_signature(code)]


def test_the_only_python_file_of_its_own_is_the_engine_guides_two_process_sample() -> None:
    """A block fenced as a file runs in no session: ``test_guide_two_process_sample.py`` runs the engine guide's
    one; any other would run nowhere."""
    found = {path.name: FILE_FENCE.findall(path.read_text()) for path in DOCS if FILE_FENCE.search(path.read_text())}
    assert found == {"engine-integration.md": ["two_processes.py"]}


# Runs the blocks given as JSON, one after another in this interpreter's __main__ (the guide's session), each
# compiled under the doc's name at its own line, so a traceback names the doc's line; says each block ran.
SESSION = """
import json as _json, sys as _sys
for _number, (_line, _source) in enumerate(_json.load(open(_sys.argv[2])), 1):
    exec(compile("\\n" * (_line - 1) + _source, _sys.argv[1], "exec"), globals())
    print(f"block {_number} ran", flush=True)
"""


def test_the_only_bash_block_is_the_multinode_guides_two_machine_commands() -> None:
    """``bash`` marks commands that run on several machines at once: ``test_multinode.py`` runs the
    one in ``docs/multinode.md`` on 127.0.0.1; any other would run nowhere."""
    found = {path.name: len(blocks(path, "bash")) for path in DOCS if blocks(path, "bash")}
    assert found == {"multinode.md": 1}


README_MOST_LINES = 250  # a few screens: what it is, the two commands, selecting, one example, the commands, links


def test_the_readme_fits_on_a_few_screens() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines; move detail to docs/ and link to it"


def test_the_readme_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text()
    guides = [path for path in sorted((ROOT / "docs").glob("*.md")) if path.name != "index.md"]  # the site's contents
    missing = [path.name for path in guides if f"](docs/{path.name})" not in readme]
    assert not missing, f"the README does not link {missing}"


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of ``path``: lowercase, punctuation but ``-`` and ``_`` dropped,
    spaces to ``-``."""
    text = FENCE.sub("", path.read_text())
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", text, re.M)
    }


def relative_links() -> list[tuple[str, str]]:
    return [
        (path.name, target)
        for path in DOCS
        for target in LINK.findall(FENCE.sub("", path.read_text()))
        if not re.match(r"[a-z]+:", target)
    ]


@pytest.mark.parametrize(("doc", "target"), relative_links(), ids=lambda v: str(v)[:60])
def test_a_relative_link_names_a_file_and_heading_that_exist(doc: str, target: str) -> None:
    source = ROOT / "README.md" if doc == "README.md" else ROOT / "docs" / doc
    file, _, anchor = target.partition("#")
    found = (source.parent / file).resolve() if file else source
    assert found.exists(), f"{doc} links {target}: no {found}"
    if anchor:
        assert anchor in anchors(found), f"{doc} links {target}: {found.name} has no such heading"


def test_every_file_with_samples_is_covered() -> None:
    assert sum(len(python_samples(path)) for path in DOCS) >= 20, "the samples were found"
    assert {"engine-integration.md", "porting-fastdeploy.md"} <= {path.name for path in DOCS if python_samples(path)}


@pytest.mark.slow
@pytest.mark.usefixtures("fastdeploy_record_names")  # the engine and porting guides write FastDeploy's record names
@pytest.mark.parametrize("path", [path for path in DOCS if python_samples(path)], ids=lambda p: p.name)
def test_the_python_samples_of_a_file_run_as_one_session(path: Path, tmp_path: Path) -> None:
    samples = python_samples(path)
    (tmp_path / "blocks.json").write_text(json.dumps(samples))
    before = shm_entries()
    command = [sys.executable, "-c", SESSION, str(path.relative_to(ROOT)), str(tmp_path / "blocks.json")]
    done, pids = run_tracked(command, cwd=ROOT, env=clean_env(), timeout=300)
    assert done.returncode == 0, f"{path.name}'s python samples failed:\n{done.stderr}"
    ran = [line for line in done.stdout.splitlines() if re.fullmatch(r"block \d+ ran", line)]
    assert ran == [f"block {number} ran" for number in range(1, len(samples) + 1)], "every block ran to its end"
    left = left_behind_by(pids, before)
    assert not left, f"{path.name}'s samples left {left} in /dev/shm"


def hook_signatures() -> list[tuple[str, str, str, str]]:
    return [
        (path.name, *SIGNATURE.fullmatch(line).groups())  # type: ignore[union-attr]
        for path in DOCS
        for block in blocks(path, "python")
        if is_signature(block)
        for line in block.splitlines()
        if line.strip()
    ]


@pytest.mark.parametrize(("doc", "hook", "params", "returns"), hook_signatures(), ids=lambda v: str(v)[:40])
def test_a_documented_hook_signature_is_the_spec(doc: str, hook: str, params: str, returns: str) -> None:
    spec = getattr(hookspecs, hook, None)
    assert spec is not None and hasattr(spec, "fd_platforms_spec"), f"{doc} documents {hook}, which is no hook"
    real = inspect.signature(spec)
    assert f"({params}) -> {returns}" == str(real).replace("'", ""), f"{doc}: {hook}{real}"


def inline_calls() -> list[tuple[str, str, str, str]]:
    """``platform.f(...)``, ``fd_platforms.f(...)`` and the engine API's own calls (``initialize_kv_cache(...)``)."""
    return [
        (path.name, owner or "engine", name, args)
        for path in DOCS
        for owner, name, args in INLINE_CALL.findall(path.read_text())
        if owner or name in engine.__all__
    ]


def target(owner: str, name: str) -> Callable[..., object]:
    import fd_platforms

    found = getattr({"platform": Platform, "fd_platforms": fd_platforms, "engine": engine}[owner], name, None)
    assert callable(found), f"{owner}.{name} does not exist"
    return found  # type: ignore[return-value]


@pytest.mark.parametrize(("doc", "owner", "name", "args"), inline_calls(), ids=lambda v: str(v)[:40])
def test_an_inline_call_in_the_docs_fits_the_signature(doc: str, owner: str, name: str, args: str) -> None:
    """Written as a call (``f(a, b=1)``): it binds (a last ``...`` stands for the arguments left out: what is
    written binds); written as a signature (``f(a, *, b)``): the same parameters, in order, as the code's."""
    real = inspect.signature(target(owner, name))
    parameters = [p for p in real.parameters.values() if p.name != "self"]
    try:
        call = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:
        call = None
    if isinstance(call, ast.Call) and not any(isinstance(a, ast.Starred) for a in call.args):
        fake = inspect.Signature(parameters)
        given = list(call.args)
        elided = bool(given) and isinstance(given[-1], ast.Constant) and given[-1].value is Ellipsis
        bind = fake.bind_partial if elided else fake.bind
        keywords = {k.arg: None for k in call.keywords if k.arg}
        bind(*(None for _ in given[: len(given) - elided]), **keywords)  # a TypeError fails
        return
    documented = ast.parse(f"def f({args}): pass").body[0].args  # type: ignore[attr-defined]
    names = [a.arg for a in (*documented.posonlyargs, *documented.args, *documented.kwonlyargs)]
    assert names == [p.name for p in parameters][: len(names)], f"{doc}: {owner}.{name}({args}) vs {real}"
    keyword_only = [a.arg for a in documented.kwonlyargs]
    assert keyword_only == [p.name for p in parameters if p.kind is p.KEYWORD_ONLY][: len(keyword_only)]


def commands(path: Path) -> list[str]:
    """The ``sh`` lines of ``path`` with continuations joined and comments dropped."""
    lines = []
    for block in blocks(path, "sh"):
        for raw in block.replace("\\\n", " ").splitlines():
            line = shlex.join(shlex.split(raw, comments=True)) if raw.strip() else ""
            if line and not line.startswith(SETUP):
                lines.append(line)
    return lines


SH_CASES = [(path.name, line) for path in DOCS for line in commands(path)]


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "line"), SH_CASES, ids=[f"{doc}:{line[:50]}" for doc, line in SH_CASES])
def test_a_documented_command_runs(doc: str, line: str, fake_device_root, fake_vendor_runtime, tmp_path: Path) -> None:
    words = shlex.split(line)
    if words[0].endswith("tools/fake-custom-device/build.sh"):  # from the repository or a plugin's folder
        assert fake_device_root(words[1]).is_dir()  # the session's build of the same script
        return
    if words[0].endswith("tools/fake-custom-device/build-host-runtime.sh"):
        assert (fake_vendor_runtime / "libmcruntime.so").is_file()  # the session's build of the same script
        return
    env = {k: v for k, v in clean_env().items() if k != "FD_PLATFORM"}
    while "=" in words[0]:
        key, value = words.pop(0).split("=", 1)
        fake = re.fullmatch(r"/tmp/fake-(\w+)", value)
        if fake and fake.group(1) == "vendor":
            value = str(fake_vendor_runtime)
        elif fake:
            value = str(fake_device_root(_device_type(fake.group(1))))
        env[key] = value
    assert words[0] == "fd-platforms", f"{doc}: an unknown command {line!r}"
    done = subprocess.run([SCRIPT, *words[1:]], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, f"{doc}: {line}\n{done.stderr}"


def _device_type(short: str) -> str:
    return {"iluvatar": "iluvatar_gpu", "metax": "metax_gpu", "nimbus": "nimbus_npu"}[short]


def test_the_setup_commands_are_the_readme_s_first_two() -> None:
    first_two = blocks(ROOT / "README.md", "sh")[:2]
    assert [block.strip().startswith("python3 -m venv .venv") for block in first_two] == [True, True]
    assert first_two[1].strip().endswith("python -m pytest") and os.path.exists(ROOT / ".ci" / "run")
