"""Sphinx configuration for fd-platforms' docs: the guides in ``docs/*.md`` and the API reference.

Build (warnings are errors, every cross-reference checked):

    python -m sphinx -W --keep-going -n -b html docs build/docs
"""

# Why Sphinx and not MkDocs: the docstrings are written with Sphinx's roles (:class:, :func:, :mod:, :attr:, several
# hundred of them), and ``nitpicky`` checks every one against a documented object, so a reference to a module that
# moved or a name that was removed fails the build instead of rendering as dead text.

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sphinx.application import Sphinx
    from sphinx.environment import BuildEnvironment

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's fd_platforms, before any installed copy

project = "fd-platforms"
author = "fd-platforms contributors"
copyright = "fd-platforms contributors"

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns: list[str] = []
html_theme = "alabaster"
html_static_path: list[str] = []

nitpicky = True
# Targets outside our control, and only those: the standard library's and other projects' objects (their docs are
# not built here, and the build reaches no network, so no intersphinx). No fd_platforms target is ever ignored.
_NOT_OURS = sorted({*sys.stdlib_module_names, "_pytest", "numpy", "paddle", "pluggy", "pytest", "typing_extensions"})
nitpick_ignore_regex = [(r"py:.*", rf"(?:{'|'.join(_NOT_OURS)})\..+")]

# Where each object is documented (so that every reference to an fd_platforms object resolves, nitpicky):
# - reference/internals/: every module (tests/docs/test_docs_build.py holds the list to the package), each with the
#   documented objects it defines (ignore-module-all: a re-export is left to the module that defines the object),
#   under the name it has there, fd_platforms.contract.types.Plan. An object a docstring names needs a docstring or
#   a doc comment (#:) of its own: else it is not on the page, and the reference fails the build;
# - reference/fd_platforms*.rst: the public faces (fd_platforms, .plugin, .engine and .engine.errors, .fastdeploy),
#   their whole __all__ (:no-ignore-module-all:, :undoc-members:); a name a face re-exports is documented under the
#   face's name too, fd_platforms.plugin.Plan, and autodoc states the defining name as its :canonical: one.
# A docstring may name either. The internals are read first (_internals_first): a face's :canonical: entry then
# defers to the real one, and two faces that share a class (plugin and engine: Plan, DeviceMemory) do not collide.
# So the build is serial: -j would read the pages in no set order.
autodoc_default_options = {"members": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_docstring_signature = False  # a signature is the code's own, never read from a docstring's first line

myst_heading_anchors = 3


# Signatures name types a module imports under ``if TYPE_CHECKING:`` (to keep import circles away, or paddle out).
# Unevaluated, autodoc shows such a name bare (``Platform``) and Sphinx guesses its target, which is ambiguous where
# two documented names end alike. So, once every module is loaded, those imports run in their module's namespace
# for the build alone; an import that fails (paddle is never imported here, _typeshed exists only for checkers) leaves
# its names as text, whose targets nitpick_ignore_regex above accepts as not ours.
def _type_checking_imports(app: Sphinx) -> None:
    import ast
    import importlib
    import pkgutil

    import fd_platforms
    from fd_platforms.lifecycle.children import WARM_MODULE

    for info in pkgutil.walk_packages(fd_platforms.__path__, "fd_platforms."):
        if info.name.endswith("__main__") or info.name == WARM_MODULE:
            continue  # importing them is what they do: run the command; import Paddle, for run's fork server
        module = importlib.import_module(info.name)
        tree = ast.parse(Path(module.__file__ or "").read_text())
        for node in tree.body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                for statement in node.body:
                    names = [alias.name for alias in getattr(statement, "names", [])]
                    if isinstance(statement, ast.Import) and "paddle" in names:
                        continue
                    with contextlib.suppress(ImportError):
                        exec(compile(ast.Module([statement], []), module.__file__ or "", "exec"), vars(module))


# A face re-exports a few data names (API_VERSION, hookimpl, FASTDEPLOY): automodule cannot tell them from what the
# face imports for itself, so its page lists them (autodata), and their doc is the one the defining module gives them.
def _reexported_data_docs(app: Sphinx, what: str, name: str, obj: object, options: object, lines: list[str]) -> None:
    from sphinx.errors import PycodeError
    from sphinx.pycode import ModuleAnalyzer

    def attr_doc(modname: str, short: str) -> list[str] | None:
        try:
            return ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", short))
        except PycodeError:
            return None

    face, _, short = name.rpartition(".")
    if what != "data" or not face.startswith("fd_platforms") or attr_doc(face, short) is not None:
        return
    for modname in sorted(sys.modules):
        if modname.startswith("fd_platforms.") and vars(sys.modules[modname]).get(short) is obj:
            doc = attr_doc(modname, short)
            if doc is not None:
                lines[:] = doc  # instead of the docstring of the value's type (str's, dict's)
                return


def _internals_first(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    docnames.sort(key=lambda name: not name.startswith("reference/internals/"))  # stable: otherwise as Sphinx has it


# Links from a page to a repository file outside docs/ (../examples/engine_runner.py, ../README.md#..., the
# ../examples/plugin-template/ folder) stay relative as written: they work where the Markdown is read (GitHub, an
# editor), and tests/docs/test_doc_samples.py checks that each names a file that exists. In the built site a file
# becomes a download of itself (myst does so for a file that is no page; _OutsideDocs does the same for the Markdown
# files outside docs/, which myst would take for pages), and a folder stays its link's text. A link to a path that
# does not exist is left to myst, which reports it.
def _outside_docs_transform() -> type:
    from docutils import nodes
    from sphinx import addnodes
    from sphinx.transforms import SphinxTransform

    class _OutsideDocs(SphinxTransform):
        default_priority = 100  # at read time: a download found here is collected with myst's own

        def apply(self, **kwargs: object) -> None:
            srcdir = Path(self.env.srcdir)
            for node in list(self.document.findall(addnodes.pending_xref)):
                if node.get("reftype") != "myst":
                    continue
                path = self._outside(node, srcdir)
                if path is None:
                    continue
                text = node[0].deepcopy() if node.children else nodes.Text(str(path))
                if path.is_file():
                    relative = os.path.relpath(path, (srcdir / self.env.docname).parent)
                    download = addnodes.download_reference(
                        refdomain=None, reftype="myst", reftarget=relative, refdoc=self.env.docname
                    )
                    download += text
                    node.replace_self(download)
                else:
                    node.replace_self(text)

        def _outside(self, node: addnodes.pending_xref, srcdir: Path) -> Path | None:
            """The repository path outside docs/ a link names, where it exists."""
            target = str(node["reftarget"])
            if node.get("refdomain") == "doc":  # myst took a Markdown file outside docs/ for a page
                if target in self.env.found_docs or not Path(target).is_absolute():
                    return None
                found = [Path(target + suffix) for suffix in self.config.source_suffix]
                path = next((candidate for candidate in found if candidate.exists()), None)
            else:
                base = (srcdir / self.env.docname).parent
                path = (base / target.partition("#")[0]).resolve()
            if path is None or not path.exists() or path.is_relative_to(srcdir) or not path.is_relative_to(ROOT):
                return None
            return path

    return _OutsideDocs


# Importing fd_platforms never imports paddle, and neither does this build (no autodoc_mock_imports needed: no module
# imports paddle at import time, and _type_checking_imports skips it), so it runs where paddle is not installed;
# a module that came to import it at import time fails the build here.
def _no_paddle(app: Sphinx, exception: BaseException | None) -> None:
    if exception is None and sys.modules.get("paddle") is not None:
        from sphinx.util import logging

        logging.getLogger(__name__).warning("importing fd_platforms' modules imported paddle")


def setup(app: Sphinx) -> None:
    app.connect("builder-inited", _type_checking_imports)
    app.connect("env-before-read-docs", _internals_first)
    app.add_transform(_outside_docs_transform())
    app.connect("autodoc-process-docstring", _reexported_data_docs)
    app.connect("build-finished", _no_paddle)
