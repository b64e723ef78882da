"""Every hook spec is documented like pytest's and conda's: params, returns, firstresult, errors."""

from __future__ import annotations

import inspect

import pytest

from fd_platforms.contract import hookspecs

SPECS = list(hookspecs.hook_names())


def test_the_contract_has_the_designed_hooks() -> None:
    assert set(SPECS) == {
        "platform_identity",
        "detect_platform",
        "supported_api_versions",
        "confirm_platform",
        "should_create_cache_tensor",
        "device_memory",
        "max_num_blocks",
        "declared_limits",
        "host_alloc",
        "wait_cache_ready",
        "cache_sharing",
        "export_cache_tensor",
        "open_cache_tensor",  # plugin API 1.1
        "kv_cache_shapes",  # plugin API 1.2
        "release_device_memory",  # plugin API 1.3
    }


@pytest.mark.parametrize("name", SPECS)
def test_each_spec_documents_params_returns_firstresult_and_errors(name: str) -> None:
    spec = getattr(hookspecs, name)
    doc = inspect.getdoc(spec) or ""
    for parameter in inspect.signature(spec).parameters:
        assert f":param {parameter}:" in doc, f"{name} does not document {parameter}"
    assert ":returns:" in doc and "firstresult: yes" in doc and "Errors:" in doc
    assert getattr(spec, f"{hookspecs.PROJECT}_spec")["firstresult"] is True
