"""The engine guide shows the code as it is: its ``CacheRequest`` table is the record's fields (which are required,
which have defaults and what they are), its records table every field and method of ``KVCache``, ``ManagedCache``
and ``HostCache`` (each method's signature as written), and every call or signature its prose writes in a code span
(``KVCache.clear(timeout=None, *, strict=True)``, ``serve_control_requests(managed, recreate, place, until=...)``)
is the real object's: a call binds, a signature is the whole signature, names, kinds and defaults."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
from run_helpers import ROOT

import fd_platforms
from fd_platforms import engine, fastdeploy
from fd_platforms.engine import CacheRequest, HostCache, KVCache, ManagedCache, WireProtocol, protocol_named
from fd_platforms.loading.platform import Platform

GUIDE = (ROOT / "docs" / "engine-integration.md").read_text(encoding="utf-8")
FENCE = re.compile(r"^```[^\n]*\n.*?^```", re.S | re.M)
PROSE = FENCE.sub("", GUIDE)  # the code blocks run (test_doc_samples.py); here, what the text says
ENTRY_POINT_GROUPS = {"fd_platforms.protocols"}  # named like a module; the group protocols register under
TICKED = re.compile(r"`(\w+)`")
CALL = re.compile(r"`(?:\w+ = )?((?:\w+\.)*)(\w+)\(([^`]*)\)`")  # `f(...)`, `owner.f(...)`, `x = owner.f(...)`
RECORDS = {"KVCache": KVCache, "ManagedCache": ManagedCache, "HostCache": HostCache}

#: What a code span in the prose may start with, and what it names: our records and the guide's variables for them.
OWNERS: dict[str, object] = {
    "platform": Platform,
    "Platform": Platform,
    "signal": engine.CacheReadySignal,
    "host": HostCache,
    "cache": KVCache,
    "managed": ManagedCache,
    "request": CacheRequest,
    "layout": engine.CacheLayout,
    "whole": engine.CacheLayout,
    "plan": engine.Plan,
    "agreement": engine.Agreement,
    "cluster": engine.Cluster,
    "fd_platforms": fd_platforms,
    "fd_platforms.engine": engine,
    "fd_platforms.engine.protocols": importlib.import_module("fd_platforms.engine.protocols"),
    "fd_platforms.fastdeploy": fastdeploy,
    **{name: getattr(engine, name) for name in engine.__all__ if inspect.isclass(getattr(engine, name))},
    **{name: getattr(fastdeploy, name) for name in fastdeploy.__all__ if inspect.isclass(getattr(fastdeploy, name))},
}
#: Calls the prose writes that are no object of ours: the stdlib's, Paddle's, FastDeploy's, the guide's own
#: ``ModelRunner`` (``runner``), or a method named without its record (``clear()``: the sentence names the record).
NOT_OURS = {
    "dataclasses",
    "subprocess",
    "fleet",
    "runner",
    "cluster.nodes",
    "IPCSignal",
    "all_reduce",
    "int",
    "view",
    "data_ptr",
    "by_name",
    "clear",
    "clear_cache",
    "restore",
    "recreate",
    "sleep",
    "wakeup",
}


def table(header: str) -> list[list[str]]:
    """The cells of each row of the guide's table whose header row is ``header``."""
    lines = GUIDE.splitlines()
    assert lines.count(header) == 1, f"the guide has one table headed {header!r}"
    rows = []
    for line in lines[lines.index(header) + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def ticked(cell: str) -> str:
    """The name a table cell holds as code: ```KVCache``` → ``KVCache``."""
    match = TICKED.fullmatch(cell)
    assert match, f"a table cell {cell!r} is no name in backticks"
    return match.group(1)


def shown(value: object) -> str:
    """A default as the guide writes it: a string in double quotes, a protocol by its name."""
    if isinstance(value, WireProtocol):
        value = value.name
    return f'"{value}"' if isinstance(value, str) else repr(value)


def signature_text(function: Callable[..., object]) -> str:
    """``(a, b=None, *, c=True, **d)``: the parameters without ``self`` and annotations, defaults as :func:`shown`."""
    parts: list[str] = []
    star = False
    for parameter in inspect.signature(function).parameters.values():
        if parameter.name == "self":
            continue
        if parameter.kind is parameter.KEYWORD_ONLY and not star:
            parts.append("*")
        star = star or parameter.kind in (parameter.KEYWORD_ONLY, parameter.VAR_POSITIONAL)
        kind = parameter.kind
        prefix = "*" if kind is parameter.VAR_POSITIONAL else "**" if kind is parameter.VAR_KEYWORD else ""
        default = "" if parameter.default is parameter.empty else f"={shown(parameter.default)}"
        parts.append(f"{prefix}{parameter.name}{default}")
    return f"({', '.join(parts)})"


# --- the CacheRequest table -----------------------------------------------------------------------------------


def test_the_request_table_is_cache_requests_fields_in_order_with_their_defaults() -> None:
    documented = [(ticked(name), default) for name, default, _ in table("| field | default | what |")]
    fields = [field for field in dataclasses.fields(CacheRequest) if field.init]
    assert [name for name, _ in documented] == [field.name for field in fields]
    for (_, default), field in zip(documented, fields, strict=True):
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if required:
            assert default == "required", f"{field.name} has no default; the guide shows {default}"
            continue
        assert default.startswith("`") and default.endswith("`"), f"{field.name}: {default}"
        written = ast.literal_eval(default.strip("`"))
        if isinstance(field.default, WireProtocol):
            assert protocol_named(written) is field.default, f"{field.name}: {written!r}"
        else:
            assert written == field.default and type(written) is type(field.default), f"{field.name}: {default}"


def test_the_request_tables_required_fields_are_the_signatures() -> None:
    """The record is keyword-only; its five required fields are those without a default."""
    parameters = inspect.signature(CacheRequest).parameters.values()
    assert all(parameter.kind is parameter.KEYWORD_ONLY for parameter in parameters)
    required = [parameter.name for parameter in parameters if parameter.default is parameter.empty]
    rows = table("| field | default | what |")
    assert required == [ticked(name) for name, default, _ in rows if default == "required"]
    assert len(required) == 5 and "the first five have no default" in GUIDE


# --- the records table ----------------------------------------------------------------------------------------


def public_fields(record: type) -> list[str]:
    """A record's fields and properties, not its private ones."""
    fields = [field.name for field in dataclasses.fields(record) if not field.name.startswith("_")]
    properties = [name for name, value in vars(record).items() if isinstance(value, property)]
    return fields + [name for name in properties if not name.startswith("_")]


def public_methods(record: type) -> dict[str, str]:
    return {
        name: f"{name}{signature_text(value)}"
        for name, value in vars(record).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


RECORD_ROWS = {ticked(row[0]): row[1:] for row in table("| record | fields | methods |")}


def test_the_records_table_holds_the_three_records() -> None:
    assert set(RECORD_ROWS) == set(RECORDS)


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_records_fields_in_the_guide_are_its_own(name: str) -> None:
    fields, _ = RECORD_ROWS[name]
    written = TICKED.findall(fields)
    assert len(written) == len(set(written)) and fields == ", ".join(f"`{field}`" for field in written), fields
    real = public_fields(RECORDS[name])
    assert sorted(written) == sorted(real), f"{name}: the guide lists {written}, the record has {real}"


@pytest.mark.parametrize("name", sorted(RECORDS))
def test_a_records_methods_in_the_guide_are_its_own_with_their_signatures(name: str) -> None:
    _, methods = RECORD_ROWS[name]
    written = re.findall(r"`(\w+\([^`]*\))`", methods)
    assert methods == ", ".join(f"`{method}`" for method in written), methods
    assert sorted(written) == sorted(public_methods(RECORDS[name]).values())


def test_host_cache_num_blocks_is_listed() -> None:
    """The field the guide once left out."""
    assert "`num_blocks`" in RECORD_ROWS["HostCache"][0] and "`host.num_blocks`" in PROSE


# --- every call and signature the prose writes ----------------------------------------------------------------


def ours(owner: str, name: str) -> bool:
    """Whether the prose's ``owner.name(...)`` calls an object of ours (:data:`NOT_OURS` names those it does not)."""
    owner = owner.rstrip(".")
    return owner not in NOT_OURS and (bool(owner) or name not in NOT_OURS)


def resolve(owner: str, name: str) -> Callable[..., object]:
    """The object ``owner.name`` names (``owner`` "": a name of ``fd_platforms.engine``, ``fd_platforms.fastdeploy``
    or ``fd_platforms``); one that does not exist fails."""
    owner = owner.rstrip(".")
    if owner:
        assert owner in OWNERS, f"the guide writes `{owner}.{name}(...)`: no object of ours is called {owner}"
        found = getattr(OWNERS[owner], name, None)
    else:
        found = next((getattr(m, name) for m in (engine, fastdeploy, fd_platforms) if hasattr(m, name)), None)
    assert callable(found), f"the guide calls {owner + '.' if owner else ''}{name}, which does not exist"
    return found  # type: ignore[no-any-return]


def prose_calls() -> list[tuple[str, str, str]]:
    """Every call the prose writes but the records table's methods, which are their records' (above)."""
    rows = tuple(f"| `{record}` | " for record in RECORDS)
    text = "\n".join(line for line in PROSE.splitlines() if not line.startswith(rows))
    return [(owner, name, " ".join(args.split())) for owner, name, args in CALL.findall(text)]


CALLS = [(owner, name, args) for owner, name, args in prose_calls() if ours(owner, name)]


def test_the_calls_of_ours_are_found() -> None:
    named = {f"{owner}{name}" for owner, name, _ in CALLS}
    assert len(CALLS) >= 40 and {"KVCache.clear", "ManagedCache.clear", "CacheRequest"} <= named, sorted(named)


@pytest.mark.parametrize(("owner", "name", "args"), CALLS, ids=[f"{o}{n}({a})"[:60] for o, n, a in CALLS])
def test_a_call_or_signature_in_the_guides_prose_is_the_codes(owner: str, name: str, args: str) -> None:
    """A call (``f(a, b=1)``, a last ``...`` standing for what is left out) binds; a signature (``f(a, *, b=None)``,
    told by its ``*``) is the whole signature: every parameter, its kind and its default, as the code has them."""
    function = resolve(owner, name)
    real = inspect.signature(function)
    parameters = [parameter for parameter in real.parameters.values() if parameter.name != "self"]
    try:
        call: Any = ast.parse(f"f({args})", mode="eval").body
    except SyntaxError:
        call = None
    if isinstance(call, ast.Call) and not any(isinstance(arg, ast.Starred) for arg in call.args):
        given = list(call.args)
        elided = bool(given) and isinstance(given[-1], ast.Constant) and given[-1].value is Ellipsis
        fake = inspect.Signature(parameters)
        bind = fake.bind_partial if elided else fake.bind
        try:
            bind(*(None for _ in given[: len(given) - elided]), **{k.arg: None for k in call.keywords if k.arg})
        except TypeError as error:
            raise AssertionError(f"the guide's `{owner}{name}({args})` does not bind to {real}: {error}") from None
        return
    assert f"({args})" == signature_text(function), f"the guide's `{owner}{name}({args})`; the code's {real}"


# --- every attribute the prose names on a record of ours ------------------------------------------------------

ATTRIBUTE = re.compile(r"`(\w+(?:\.\w+)*)\.(\w+)`")


def attributes() -> list[tuple[str, str]]:
    found = []
    for owner, name in ATTRIBUTE.findall(PROSE):
        head, _, _ = owner.partition(".")
        if owner in OWNERS or (head in OWNERS and head != "fd_platforms"):
            found.append((owner, name))
    return found


def has(owner: object, name: str) -> bool:
    """Whether ``owner`` (a class or module of ours) has ``name``: a field, an attribute, a submodule, or for a class an
    attribute its ``__init__`` (or a base's) sets on ``self``."""
    if inspect.ismodule(owner):
        try:
            importlib.import_module(f"{owner.__name__}.{name}")
        except ModuleNotFoundError:
            return hasattr(owner, name)
        return True
    fields = {field.name for field in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
    if name in fields or hasattr(owner, name):
        return True
    bases = [base for base in getattr(owner, "__mro__", ()) if base.__module__.startswith("fd_platforms")]
    return any(f"self.{name}" in inspect.getsource(base.__init__) for base in bases if "__init__" in vars(base))


@pytest.mark.parametrize(("owner", "name"), attributes(), ids=[f"{o}.{n}" for o, n in attributes()])
def test_an_attribute_the_guide_names_on_a_record_of_ours_is_there(owner: str, name: str) -> None:
    """``host.num_blocks``, ``request.wire``, ``CacheRequest.creator_pid``: the first step past a record of ours (the
    rest is that value's, ``host.buffer.kind``) is one of its fields or attributes."""
    if f"{owner}.{name}" in ENTRY_POINT_GROUPS:
        return
    head, *rest = owner.split(".")
    found: object = OWNERS[head]
    for step in [*rest, name]:  # through modules (fd_platforms.engine.errors), to the first step past a record
        assert has(found, step), f"the guide names `{owner}.{name}`: {found!r} has no {step}"
        if not inspect.ismodule(found):
            return
        found = getattr(found, step, None) or importlib.import_module(f"{found.__name__}.{step}")
