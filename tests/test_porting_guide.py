"""The porting guide's numbers come from its own code: the glue a FastDeploy runner keeps is counted in the
guide's sample, the one ``tests/test_doc_samples.py`` runs, and the guide states that count."""

from __future__ import annotations

import ast
import io
import re
import tokenize

from run_helpers import ROOT

GUIDE = ROOT / "docs" / "porting-fastdeploy.md"
PORTED = ("GPUModelRunner", "MTPProposer")  # what a FastDeploy runner and proposer hold after the port
LIMIT = 30  # issue 35: the glue a FastDeploy runner needs is at most 30 lines


def code_lines(source: str, node: ast.ClassDef) -> int:
    """Lines of ``node`` holding code: no blank line, comment or docstring."""
    docstrings = {
        line
        for child in ast.walk(node)
        if isinstance(child, (ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(child) is not None
        for line in range(child.body[0].lineno, child.body[0].end_lineno + 1)  # type: ignore[operator]
    }
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            lines.update(range(token.start[0], token.end[0] + 1))
    return len({line for line in lines if node.lineno <= line <= node.end_lineno} - docstrings)  # type: ignore[operator]


def test_the_glue_the_guide_states_is_the_glue_its_sample_holds_and_within_the_limit() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    block = next(body for body in re.findall(r"```python\n(.*?)```", text, re.S) if "class GPUModelRunner" in body)
    tree = ast.parse(block)
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in PORTED]
    assert [node.name for node in classes] == list(PORTED)
    counted = sum(code_lines(block, node) for node in classes)
    stated = re.search(r"\*\*(\d+) lines\*\* of code", text)
    assert stated is not None and int(stated.group(1)) == counted, (stated, counted)
    assert counted <= LIMIT
