"""Detection from runtime facts: distributions, device nodes, visibility variables."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

import fd_platforms_cuda
import fd_platforms_iluvatar
import fd_platforms_metax
import fd_platforms_xpu
from fd_platforms.kit.probes import device_nodes, installed_distribution, visible_count

PLUGINS = {
    "cuda": (fd_platforms_cuda, "gpu", "CUDA_VISIBLE_DEVICES", "paddlepaddle-gpu"),
    "xpu": (fd_platforms_xpu, "xpu", "XPU_VISIBLE_DEVICES", "paddlepaddle-xpu"),
    "iluvatar": (fd_platforms_iluvatar, "iluvatar_gpu", "CUDA_VISIBLE_DEVICES", "paddle-iluvatar-gpu"),
    "metax": (fd_platforms_metax, "metax_gpu", "MACA_VISIBLE_DEVICES", "paddle-metax-gpu"),
}


@pytest.fixture
def fake_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Make ``importlib.metadata`` see an installed distribution (metadata only)."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(name: str, version: str = "3.3.1") -> None:
        info = tmp_path / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        importlib.invalidate_caches()

    return make


def fake_nodes(folder: Path, *names: str) -> str:
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return str(folder / "nvidia[0-9]*")


@pytest.mark.parametrize("name", PLUGINS)
def test_identity_facts(name: str) -> None:
    module, device_type, env_var, _ = PLUGINS[name]
    identity = module.PLATFORM.platform_identity()
    assert (identity.name, identity.device_type, identity.visible_devices_env) == (name, device_type, env_var)
    assert identity.device_string(3) == f"{device_type}:3"


@pytest.mark.parametrize("name", PLUGINS)
def test_unavailable_without_the_runtime_says_what_to_install(name: str) -> None:
    module, _, _, dist = PLUGINS[name]
    detection = module.PLATFORM.detect_platform()
    assert not detection.available and detection.device_count == 0
    assert f"{dist} is not installed" in detection.reason and f"pip install {dist}" in detection.reason


def test_runtime_and_nodes_make_a_platform_available(tmp_path: Path, fake_dist) -> None:
    fake_dist("paddlepaddle-gpu")
    facts = dataclasses.replace(
        fd_platforms_cuda.PLATFORM, device_glob=fake_nodes(tmp_path / "dev", "nvidia0", "nvidia1", "nvidiactl")
    )
    detection = facts.detect_platform(environ={})
    assert detection.available and detection.device_count == 2
    assert detection.reason == "paddlepaddle-gpu 3.3.1 installed, 2 of 2 devices visible"
    assert facts.detect_platform(environ={"CUDA_VISIBLE_DEVICES": "1"}).device_count == 1
    hidden = facts.detect_platform(environ={"CUDA_VISIBLE_DEVICES": ""})
    assert not hidden.available and "hides all" in hidden.reason and "unset CUDA_VISIBLE_DEVICES" in hidden.reason


def test_runtime_without_device_nodes_is_unavailable(tmp_path: Path, fake_dist) -> None:
    fake_dist("paddlepaddle-xpu")
    facts = dataclasses.replace(fd_platforms_xpu.PLATFORM, device_glob=str(tmp_path / "xpu[0-9]*"))
    detection = facts.detect_platform(environ={})
    assert not detection.available and "no device node matches" in detection.reason


def test_iluvatar_counts_its_drivers_nodes(tmp_path: Path, fake_dist) -> None:
    fake_dist("paddle-iluvatar-gpu", "3.3.0")
    assert fd_platforms_iluvatar.PLATFORM.device_glob == "/dev/iluvatar[0-9]*"
    (tmp_path / "dev").mkdir()
    for name in ("iluvatar2", "iluvatar3"):  # a pod's nodes keep the host's numbers
        (tmp_path / "dev" / name).touch()
    facts = dataclasses.replace(fd_platforms_iluvatar.PLATFORM, device_glob=str(tmp_path / "dev" / "iluvatar[0-9]*"))
    detection = facts.detect_platform(environ={})
    assert detection.available and detection.device_count == 2
    assert (
        not dataclasses.replace(facts, device_glob=str(tmp_path / "none[0-9]*")).detect_platform(environ={}).available
    )


def test_metax_count_is_left_to_paddle(fake_dist) -> None:
    fake_dist("paddle-metax-gpu", "3.3.0")
    detection = fd_platforms_metax.PLATFORM.detect_platform()
    assert detection.available and detection.device_count == 0
    assert "known once paddle starts" in detection.reason


def test_helpers(tmp_path: Path) -> None:
    pattern = fake_nodes(tmp_path / "d", "nvidia10", "nvidia2", "nvidia-uvm")
    assert [Path(p).name for p in device_nodes(pattern)] == ["nvidia2", "nvidia10"]
    assert visible_count(4, "X", {}) == 4 and visible_count(4, "X", {"X": "0,1,"}) == 2
    assert visible_count(1, "X", {"X": "0,1,2"}) == 1
    assert visible_count(4, "X", {"X": "-1"}) == 0 and visible_count(4, "X", {"X": "0,-1,2"}) == 1  # as CUDA reads it
    assert installed_distribution("no-such-dist-xyz", "pluggy")[0] == "pluggy"
    assert installed_distribution("no-such-dist-xyz") is None
