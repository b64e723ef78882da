"""Identity, detection, confirmation, the declared API range and the hook names."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ...contract import hookspecs
from ...contract.api_version import API_VERSION
from ...contract.types import Detection, PlatformIdentity
from ...loading.platform import Platform
from . import hooks

ALL_HOOKS = set(hookspecs.hook_names())
DEVICE_TYPE = re.compile(r"[a-z][a-z0-9_]*")
ENV_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


@hooks("platform_identity")
def test_identity_record(fd_platform: Platform, fd_platform_name: str) -> None:
    identity = fd_platform.identity
    assert isinstance(identity, PlatformIdentity)
    assert identity.name == fd_platform_name, "platform_identity().name must equal the entry-point name"
    assert DEVICE_TYPE.fullmatch(identity.device_type), f"device_type {identity.device_type!r}: lower_snake_case"
    env = identity.visible_devices_env
    assert env is None or ENV_NAME.fullmatch(env), f"visible_devices_env {env!r}: None or an UPPER_CASE name"
    assert identity.device_string(0).startswith(identity.device_type)


@hooks("detect_platform")
def test_detection_record(fd_platform: Platform) -> None:
    detection = fd_platform.detect()
    assert isinstance(detection, Detection)
    assert isinstance(detection.available, bool)
    assert isinstance(detection.reason, str) and detection.reason.strip(), "detection must say why, in words"
    assert isinstance(detection.device_count, int) and detection.device_count >= 0
    if not detection.available:
        assert detection.device_count == 0, "an unavailable platform reports no devices"


@hooks("detect_platform")
def test_detection_never_imports_paddle(fd_platform_name: str) -> None:
    """Loading the plugin and detecting it stay cheap (``fd-platforms list`` does it for every platform)."""
    script = (
        "import sys\n"
        "from fd_platforms.loading.discovery import discover\n"
        "from fd_platforms.loading.platform import load_platform\n"
        "from fd_platforms.loading.selection import single_candidate\n"
        f"load_platform(single_candidate(discover(), {fd_platform_name!r}), drift_guard=False).detect()\n"
        "print(sorted(name for name in ('paddle', 'torch', 'numpy') if name in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing the plugin and detect_platform imported {done.stdout.strip()}"


@hooks("confirm_platform")
def test_confirmation_record(fd_platform: Platform) -> None:
    detection = fd_platform.detect()
    if not detection.available:
        pytest.skip(f"confirmation runs only where detection succeeds: {detection.reason}")
    confirmed = fd_platform.confirm()
    assert confirmed is None or isinstance(confirmed, Detection)
    if confirmed is not None:
        assert confirmed.reason.strip(), "a confirmation must say why, in words"
        if confirmed.available:
            assert confirmed.device_count >= 1, "a confirmed platform counts its devices"


@hooks("supported_api_versions")
def test_declared_api_range_holds_this_core(fd_platform: Platform) -> None:
    from packaging.specifiers import SpecifierSet

    declared = fd_platform.manager.hook.supported_api_versions()
    assert SpecifierSet(declared).contains(API_VERSION, prereleases=True)


def test_every_hook_is_known_and_the_required_ones_are_there(fd_platform: Platform) -> None:
    implemented = fd_platform.implemented_hooks()
    assert implemented <= ALL_HOOKS, f"unknown hook names: {sorted(implemented - ALL_HOOKS)}"
    assert set(hookspecs.REQUIRED_HOOKS) <= implemented
