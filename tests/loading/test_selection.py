"""Every branch of FD_PLATFORM / FD_PLATFORM_PLUGINS selection, through real entry points."""

from __future__ import annotations

import logging

import pytest

from fd_platforms.contract.errors import (
    AmbiguousPlatformError,
    DeviceFactsUnavailableError,
    DuplicatePlatformError,
    PlatformUnavailableError,
    PluginContractError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    SelectionError,
    UnknownPlatformError,
)
from fd_platforms.contract.types import DeviceMemory
from fd_platforms.loading.discovery import discover
from fd_platforms.loading.platform import Platform, load_platform
from fd_platforms.loading.selection import Prober, select_platform, survey

IN_REPO = ["cuda", "dcu", "gcu", "iluvatar", "intel_hpu", "metax", "npu", "xpu"]


def test_in_repo_plugins_are_discovered_through_entry_points() -> None:
    found = discover()
    assert list(found)[:1] == ["cpu"]
    for name in IN_REPO:
        (candidate,) = found[name]
        assert candidate.distribution == f"fd-platforms-{name.replace('_', '-')}"
        assert candidate.entry_point.value == f"fd_platforms_{name}:PLATFORM"
        assert not candidate.builtin


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_nothing_detected_falls_back_to_cpu_with_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="fd_platforms")
    selection = select_platform({})
    assert (selection.platform.name, selection.how) == ("cpu", "fallback")
    unavailable = selection.reason.split(": ", 1)[1].removesuffix(" not available").split(", ")
    assert set(IN_REPO) <= set(unavailable)
    infos = [r for r in caplog.records if r.name == "fd_platforms" and r.levelno == logging.INFO]
    assert len(infos) == 1 and "built-in cpu" in infos[0].getMessage()


def test_fd_platform_selects_by_name() -> None:
    selection = select_platform({"FD_PLATFORM": "cpu"})
    assert (selection.platform.name, selection.how, selection.reason) == ("cpu", "env", "FD_PLATFORM=cpu")


def test_selected_but_not_detected_is_a_hard_error_with_the_reason() -> None:
    with pytest.raises(PlatformUnavailableError) as info:
        select_platform({"FD_PLATFORM": "cuda"})
    message = str(info.value)
    assert "FD_PLATFORM='cuda'" in message and "fd-platforms-cuda" in message
    assert "paddlepaddle-gpu is not installed" in message and "pip install paddlepaddle-gpu" in message


def test_unknown_name_lists_installed_platforms() -> None:
    with pytest.raises(UnknownPlatformError) as info:
        select_platform({"FD_PLATFORM": "nosuch"})
    assert info.value.exit_code == 2
    assert "FD_PLATFORM='nosuch'" in str(info.value)
    assert f"Choose one of: {', '.join(discover())}" in str(info.value)


@pytest.mark.parametrize(
    ("typed", "meant"), [("Cpu", "cpu"), ("CUDA", "cuda"), ("Intel_HPU", "intel_hpu"), ("cdua", "cuda")]
)
def test_a_name_in_another_case_is_told_the_installed_one_before_a_near_spelling(typed: str, meant: str) -> None:
    with pytest.raises(UnknownPlatformError, match=f"Fix: did you mean '{meant}'\\?"):
        select_platform({"FD_PLATFORM": typed})


def test_missing_in_repo_plugin_says_how_to_install_it() -> None:
    without_xpu = {name: cands for name, cands in discover().items() if name != "xpu"}
    with pytest.raises(UnknownPlatformError) as info:
        select_platform({"FD_PLATFORM": "xpu"}, Prober(found=without_xpu))
    assert "pip install ./plugins/xpu" in str(info.value)
    assert f"Choose one of: {', '.join(without_xpu)}." in str(info.value)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_exactly_one_available_is_detected(make_plugin) -> None:
    make_plugin("acme", reason="acme driver 1.2, 2 devices")
    selection = select_platform({})
    assert (selection.platform.name, selection.how) == ("acme", "detected")
    assert "acme driver 1.2" in selection.reason
    assert selection.platform.distribution == "fd-test-acme"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_several_available_is_an_error_naming_them(make_plugin) -> None:
    make_plugin("acme")
    make_plugin("zeta")
    with pytest.raises(AmbiguousPlatformError) as info:
        select_platform({})
    assert "acme" in str(info.value) and "zeta" in str(info.value)
    assert "set FD_PLATFORM to one of: acme, zeta" in str(info.value)


def test_fd_platform_chooses_among_several(make_plugin) -> None:
    make_plugin("acme")
    make_plugin("zeta")
    assert select_platform({"FD_PLATFORM": "zeta"}).platform.name == "zeta"


def test_allow_list_limits_the_plugins_considered(make_plugin) -> None:
    make_plugin("acme")
    make_plugin("zeta")
    assert select_platform({"FD_PLATFORM_PLUGINS": "zeta, cuda"}).platform.name == "zeta"
    empty = select_platform({"FD_PLATFORM_PLUGINS": ""})
    assert (empty.platform.name, empty.how) == ("cpu", "fallback")
    assert "no plugin considered" in empty.reason


def test_allow_list_with_unknown_name_is_an_error() -> None:
    with pytest.raises(UnknownPlatformError) as info:
        select_platform({"FD_PLATFORM_PLUGINS": "cuda,cdua"})
    assert "FD_PLATFORM_PLUGINS='cdua'" in str(info.value)
    assert "Choose one of: cpu, cuda" in str(info.value)


def test_fd_platform_excluded_by_allow_list_is_an_error(make_plugin) -> None:
    make_plugin("acme")
    with pytest.raises(SelectionError) as info:
        select_platform({"FD_PLATFORM": "acme", "FD_PLATFORM_PLUGINS": "cuda"})
    assert "excluded by FD_PLATFORM_PLUGINS='cuda'" in str(info.value)
    assert "add acme to FD_PLATFORM_PLUGINS" in str(info.value)


BROKEN_IMPORT = "import fd_platforms\nraise ImportError('libacme.so.3: cannot open shared object file')\n"


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_broken_plugin_never_stops_the_others(make_plugin, caplog: pytest.LogCaptureFixture) -> None:
    make_plugin("broken", source=BROKEN_IMPORT)
    make_plugin("acme")
    selection = select_platform({})
    assert selection.platform.name == "acme"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("broken" in w and "libacme.so.3" in w for w in warnings)
    report = {r.name: r for r in survey({}).reports}["broken"]
    assert report.status == "broken" and "libacme.so.3" in report.reason


def test_selected_broken_plugin_names_plugin_distribution_and_cause(make_plugin) -> None:
    make_plugin("broken", source=BROKEN_IMPORT)
    with pytest.raises(PluginLoadError) as info:
        select_platform({"FD_PLATFORM": "broken"})
    message = str(info.value)
    assert "'broken'" in message and "fd-test-broken" in message
    assert "ImportError: libacme.so.3" in message


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_detection_that_raises_marks_the_plugin_broken(make_plugin) -> None:
    source = (
        "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import PlatformIdentity\n"
        "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('flaky', 'flaky', None)\n"
        "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
        "@hookimpl\ndef detect_platform():\n    raise OSError('vendor SMI crashed')\n"
    )
    make_plugin("flaky", source=source)
    assert select_platform({}).platform.name == "cpu"
    report = {r.name: r for r in survey({}).reports}["flaky"]
    assert report.status == "broken" and "OSError: vendor SMI crashed" in report.reason


def test_two_distributions_with_one_name_are_an_error_naming_both(make_plugin) -> None:
    make_plugin("acme", dist="fd-acme-one")
    make_plugin("acme", dist="fd-acme-two")
    with pytest.raises(DuplicatePlatformError) as info:
        select_platform({"FD_PLATFORM": "acme"})
    assert "fd-acme-one 1.0" in str(info.value) and "fd-acme-two 1.0" in str(info.value)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_duplicate_name_never_blocks_the_other_platforms(make_plugin) -> None:
    make_plugin("acme", dist="fd-acme-one")
    make_plugin("acme", dist="fd-acme-two")
    make_plugin("other", available=True)
    assert select_platform({"FD_PLATFORM": "other"}).platform.name == "other"
    assert select_platform({"FD_PLATFORM": "cpu"}).platform.name == "cpu"
    detected = select_platform({})  # acme is broken, so other is the only platform detected
    assert (detected.platform.name, detected.how) == ("other", "detected")
    reports = [report for report in survey({}).reports if report.name == "acme"]
    assert [(r.distribution, r.status) for r in reports] == [("fd-acme-one", "broken"), ("fd-acme-two", "broken")]
    assert all("fd-acme-one 1.0 and fd-acme-two 1.0" in r.reason for r in reports)


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_external_plugin_cannot_shadow_the_builtin_cpu(make_plugin) -> None:
    make_plugin("cpu", dist="fd-fake-cpu")
    with pytest.raises(DuplicatePlatformError) as info:
        select_platform({})
    assert "fd-platforms" in str(info.value) and "fd-fake-cpu" in str(info.value)


IDENTITY = (
    "from fd_platforms import hookimpl\nfrom fd_platforms.contract.types import Detection, PlatformIdentity\n"
    "@hookimpl\ndef platform_identity():\n    return PlatformIdentity('odd', 'odd', None)\n"
    "@hookimpl\ndef supported_api_versions():\n    return '>=1.0,<2'\n"
)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("@hookimpl\ndef detect_platfrom():\n    return Detection(True, 'x', 1)\n", "detect_platfrom"),
        ("@hookimpl\ndef detect_platform(device):\n    return Detection(True, 'x', 1)\n", "device"),
        ("", "required hook(s) detect_platform not implemented"),
    ],
    ids=["misspelled-hook", "unknown-argument", "missing-required-hook"],
)
def test_hook_mistakes_are_caught_at_registration(make_plugin, extra: str, expected: str) -> None:
    make_plugin("odd", source=IDENTITY + extra)
    with pytest.raises(PluginHookError) as info:
        select_platform({"FD_PLATFORM": "odd"})
    assert "platform plugin 'odd' (distribution fd-test-odd)" in str(info.value)
    assert expected in str(info.value)


def test_a_module_function_named_like_a_hook_without_the_marker_is_refused(make_plugin) -> None:
    source = IDENTITY + "@hookimpl\ndef detect_platform():\n    return Detection(True, 'x', 1)\n"
    make_plugin("odd", source=source + "def device_memory(device_id):\n    return None\n")
    with pytest.raises(PluginHookError) as info:
        select_platform({"FD_PLATFORM": "odd"})
    assert "defines device_memory without @hookimpl, so pluggy would never call it" in str(info.value)
    assert "Fix: decorate each with @fd_platforms.hookimpl" in str(info.value)


SUBCLASS = """
from fd_platforms import hookimpl
from fd_platforms.kit.custom_device import CustomDeviceFacts
from fd_platforms.kit.paddle_platform import PaddlePlatform
from fd_platforms.contract.types import DeviceMemory

class Nebula(PaddlePlatform):
    {marker}
    def device_memory(self, device_id):
        return DeviceMemory(7 * 2**30, None, None, "Nebula's own reading")

PLATFORM = Nebula(name="nebula", device_type="nebula_npu", visible_devices_env=None,
                  distributions=("fd-test-nebula",), device_glob=None, install_hint="x", api_versions=">=1.0,<2",
                  description="a subclass", facts=CustomDeviceFacts)
"""


def load_nebula() -> Platform:
    [candidate] = discover()["nebula"]
    return load_platform(candidate)


def test_a_paddle_platform_subclass_overriding_a_hook_without_the_marker_is_refused(make_plugin) -> None:
    make_plugin("nebula", source=SUBCLASS.format(marker=""), attribute="PLATFORM")
    with pytest.raises(PluginHookError) as info:
        load_nebula()
    assert "Nebula defines device_memory without @hookimpl" in str(info.value)


def test_a_paddle_platform_subclass_overriding_a_hook_with_the_marker_works(make_plugin) -> None:
    make_plugin("nebula", source=SUBCLASS.format(marker="@hookimpl"), attribute="PLATFORM")
    assert load_nebula().device_memory(0) == DeviceMemory(7 * 2**30, None, None, "Nebula's own reading")


def test_identity_must_match_the_entry_point_name(make_plugin) -> None:
    make_plugin("named", source=IDENTITY + "@hookimpl\ndef detect_platform():\n    return Detection(True, 'x', 1)\n")
    with pytest.raises(PluginContractError) as info:
        select_platform({"FD_PLATFORM": "named"})
    assert "says name 'odd' but the entry point registers 'named'" in str(info.value)


def test_wrong_record_type_is_a_contract_error(make_plugin) -> None:
    source = IDENTITY.replace("'odd'", "'liar'", 1) + "@hookimpl\ndef detect_platform():\n    return True\n"
    make_plugin("liar", source=source)
    with pytest.raises(PluginContractError) as info:
        select_platform({"FD_PLATFORM": "liar"})
    assert "detect_platform returned bool" in str(info.value) and "must return Detection" in str(info.value)


CONFIRMING_PLUGIN = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity("acme", "acme_npu", "ACME_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection(True, "libacme installed; count known once paddle starts", 0)

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"

@hookimpl
def confirm_platform():
    {body}
"""


def confirming(make_plugin, body: str) -> None:
    make_plugin("acme", source=CONFIRMING_PLUGIN.format(body=body))


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_confirmation_replaces_the_cheap_detection(make_plugin) -> None:
    confirming(make_plugin, 'return Detection(True, "paddle registers acme_npu with 4 devices", 4)')
    selection = select_platform({})
    assert (selection.platform.name, selection.how) == ("acme", "detected")
    assert "paddle registers acme_npu with 4 devices" in selection.reason
    report = {r.name: r for r in survey({"FD_PLATFORM": "acme"}).reports}["acme"]
    assert (report.status, report.device_count) == ("available", 4)


def test_refused_confirmation_of_the_requested_platform_is_a_hard_error(make_plugin) -> None:
    confirming(make_plugin, 'return Detection(False, "paddle registers no acme_npu device. Fix: install libacme")')
    with pytest.raises(PlatformUnavailableError, match="not available here: paddle registers no acme_npu device"):
        select_platform({"FD_PLATFORM": "acme"})


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_refused_confirmation_of_a_detected_platform_falls_back_to_cpu(make_plugin) -> None:
    confirming(make_plugin, 'return Detection(False, "paddle registers no acme_npu device")')
    selection = select_platform({})
    assert selection.platform.name == "cpu" and "detected: acme, cuda" in selection.reason
    report = {r.name: r for r in survey({}).reports}["acme"]
    assert report.status == "unavailable" and "paddle registers no acme_npu device" in report.reason


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_confirmation_that_raises_marks_the_plugin_broken(make_plugin) -> None:
    confirming(make_plugin, 'raise OSError("driver mismatch")')
    with pytest.raises(PluginError, match="hook confirm_platform raised OSError: driver mismatch"):
        select_platform({"FD_PLATFORM": "acme"})
    assert select_platform({}).platform.name == "cpu"


def test_confirmation_must_return_a_detection(make_plugin) -> None:
    confirming(make_plugin, 'return "yes"')
    with pytest.raises(PluginContractError, match="confirm_platform returned str"):
        select_platform({"FD_PLATFORM": "acme"})


def test_unselected_platforms_are_never_confirmed(make_plugin, tmp_path) -> None:
    marker = tmp_path / "confirmed"
    confirming(make_plugin, f'open({str(marker)!r}, "w").close(); return None')
    make_plugin("zeta")
    assert select_platform({"FD_PLATFORM": "zeta"}).platform.name == "zeta"
    assert not marker.exists()
    select_platform({"FD_PLATFORM": "acme"})
    assert marker.exists()


def test_a_plugin_without_memory_facts_says_how_to_plan_anyway(make_plugin) -> None:
    make_plugin("acme")
    platform = select_platform({"FD_PLATFORM": "acme"}).platform
    with pytest.raises(
        DeviceFactsUnavailableError, match=r"does not report the memory of device 0.*--device-memory SIZE"
    ):
        platform.device_memory(0)
