"""Which accelerators this host has, from its device nodes: the core's table of known nodes.

Selection falls back to the cpu platform only where no accelerator is present: a host whose
``/dev`` holds an NVIDIA GPU's nodes but whose cuda plugin is unavailable (no Paddle CUDA build)
must not plan its KV cache in host memory as if it were the device. Two sources say what is
present, and neither imports a plugin or paddle:

- :data:`KNOWN_ACCELERATORS`, the nodes each vendor's driver makes, with the platform and
  distribution that drive them (so a host with no plugin installed for them is told what to install);
- each installed plugin's own statement (:class:`NodeClaim`, a ``RuntimeFacts`` record's
  ``device_glob``), for devices the table does not know.

A visibility variable that hides every device (``CUDA_VISIBLE_DEVICES=""``, the usual way to run on
cpu on purpose) leaves no accelerator present.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from dataclasses import dataclass

from ..kit.probes import stated_fact, visible_count


@dataclass(frozen=True)
class KnownAccelerator:
    """One vendor's device nodes and the platform that drives them.

    ``nodes``: a glob of the nodes the driver makes; ``visible_devices_env``: the variable that hides
    devices from its runtime; ``source``: where the node names come from; ``also_made_by``: what else makes
    the nodes, where a host may have them without the accelerator (said when none can be used).
    """

    vendor: str
    nodes: str
    platform: str
    distribution: str
    visible_devices_env: str
    source: str
    also_made_by: str | None = None


#: The device nodes each vendor's driver makes, with the platform and distribution that drive them.
KNOWN_ACCELERATORS = (
    KnownAccelerator(
        vendor="NVIDIA",
        nodes="/dev/nvidia[0-9]*",
        platform="cuda",
        distribution="fd-platforms-cuda",
        visible_devices_env="CUDA_VISIBLE_DEVICES",
        source="NVIDIA's driver makes /dev/nvidiaN for GPU N (beside /dev/nvidiactl and /dev/nvidia-uvm)",
    ),
    KnownAccelerator(
        vendor="Kunlun",
        nodes="/dev/xpu[0-9]*",
        platform="xpu",
        distribution="fd-platforms-xpu",
        visible_devices_env="XPU_VISIBLE_DEVICES",
        source="Kunlun's XPU driver makes /dev/xpuN for XPU N (beside /dev/xpuctrl)",
    ),
    KnownAccelerator(
        vendor="Iluvatar",
        nodes="/dev/iluvatar[0-9]*",
        platform="iluvatar",
        distribution="fd-platforms-iluvatar",
        visible_devices_env="CUDA_VISIBLE_DEVICES",
        source="Iluvatar's CoreX driver makes /dev/iluvatarN per GPU (major 508, numbered as on the host)",
    ),
    KnownAccelerator(
        vendor="MetaX",
        nodes="/dev/mxcd",
        platform="metax",
        distribution="fd-platforms-metax",
        visible_devices_env="MACA_VISIBLE_DEVICES",
        source="MetaX's driver makes the control node /dev/mxcd; its GPUs are /dev/dri render nodes, which "
        "other vendors' GPUs have too",
    ),
    KnownAccelerator(
        vendor="ROCm (Hygon DCU, AMD)",
        nodes="/dev/kfd",
        platform="dcu",
        distribution="fd-platforms-dcu",
        visible_devices_env="HIP_VISIBLE_DEVICES",
        source="the ROCm/DTK driver's kernel fusion driver node /dev/kfd, one for all devices (FastDeploy's Hygon "
        "DCU guide mounts /dev/kfd and /dev/dri); its GPUs are /dev/dri render nodes, which other vendors' GPUs "
        "have too",
        also_made_by="Linux's amdgpu driver makes /dev/kfd for any AMD GPU, an AMD desktop's integrated display GPU "
        "too, so this may be no accelerator for serving at all",
    ),
    KnownAccelerator(
        vendor="Enflame",
        nodes="/dev/gcu[0-9]*",
        platform="gcu",
        distribution="fd-platforms-gcu",
        visible_devices_env="TOPS_VISIBLE_DEVICES",
        source="Enflame's driver makes /dev/gcuN per card, and its codec nodes /dev/gcuNvidM beside them",
    ),
    KnownAccelerator(
        vendor="Intel Gaudi",
        nodes="/dev/accel/accel_controlD[0-9]*",
        platform="intel_hpu",
        distribution="fd-platforms-intel-hpu",
        visible_devices_env="HABANA_VISIBLE_MODULES",
        source="habanalabs makes /dev/accel/accel_controlDN per device beside /dev/accel/accelN, the kernel's "
        "accel class, which other vendors' NPUs use too",
    ),
    KnownAccelerator(
        vendor="Ascend",
        nodes="/dev/davinci[0-9]*",
        platform="npu",
        distribution="fd-platforms-npu",
        visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
        source="Ascend's driver makes /dev/davinciN per NPU (beside /dev/davinci_manager, /dev/devmm_svm and "
        "/dev/hisi_hdc)",
    ),
)


@dataclass(frozen=True)
class NodeClaim:
    """The device nodes an installed plugin states it drives, and the variable that hides them."""

    glob: str
    visible_devices_env: str | None


def node_claim(plugin: object) -> NodeClaim | None:
    """What a plugin object states about device nodes: a ``RuntimeFacts`` record's ``device_glob``
    under ``/dev`` and its visibility variable (no plugin code runs), or None."""
    pattern = stated_fact(plugin, "device_glob")
    if pattern is None or not pattern.startswith("/dev/"):
        return None
    return NodeClaim(pattern, stated_fact(plugin, "visible_devices_env"))


@dataclass(frozen=True)
class PresentAccelerator:
    """Device nodes found here and the platforms that drive them.

    ``vendor``: the table's (None for nodes only a plugin claims); ``platforms``: the table's platform
    and the installed plugins whose claim matches the nodes; ``distribution``: the table's
    distribution for them (None for nodes only a plugin claims).
    """

    vendor: str | None
    nodes: tuple[str, ...]
    platforms: tuple[str, ...]
    distribution: str | None
    also_made_by: str | None = None

    def describe(self) -> str:
        """``NVIDIA devices are present here (/dev/nvidia0, /dev/nvidia1)``, and what else makes such nodes."""
        what = f"{self.vendor} devices" if self.vendor else f"devices that platform {self.platforms[0]} drives"
        also = f" ({self.also_made_by})" if self.also_made_by else ""
        return f"{what} are present here ({shown(self.nodes)}){also}"


@dataclass(frozen=True)
class Hidden:
    """Device nodes found here that a visibility variable hides (``CUDA_VISIBLE_DEVICES=""``)."""

    vendor: str | None
    nodes: tuple[str, ...]
    variable: str
    value: str

    def describe(self) -> str:
        """``NVIDIA devices /dev/nvidia0 hidden by CUDA_VISIBLE_DEVICES=''``."""
        what = f"{self.vendor} devices" if self.vendor else "device nodes"
        return f"{what} {shown(self.nodes)} hidden by {self.variable}={self.value!r}"


def shown(nodes: tuple[str, ...]) -> str:
    """Device nodes as a message names them: the first four, and how many more."""
    return ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")


def find_nodes(pattern: str) -> tuple[str, ...]:
    """The paths matching ``pattern``, sorted (numbered or not: MetaX's is one control node)."""
    return tuple(sorted(glob.glob(pattern)))


def present_accelerators(
    environ: Mapping[str, str], claims: Mapping[str, NodeClaim] | None = None
) -> tuple[tuple[PresentAccelerator, ...], tuple[Hidden, ...]]:
    """The accelerators present here, and those whose nodes a visibility variable hides.

    ``claims``: each installed plugin's statement, by platform name; a plugin whose nodes overlap a
    known accelerator's joins that one.
    """
    claims = claims or {}
    claimed = {name: find_nodes(claim.glob) for name, claim in claims.items()}
    present: list[PresentAccelerator] = []
    hidden: list[Hidden] = []

    def consider(
        vendor: str | None,
        nodes: tuple[str, ...],
        env: str | None,
        platforms: tuple[str, ...],
        dist: str | None,
        also: str | None = None,
    ) -> None:
        if env is not None and env in environ and visible_count(len(nodes), env, environ) == 0:
            hidden.append(Hidden(vendor, nodes, env, environ[env]))
        else:
            present.append(PresentAccelerator(vendor, nodes, platforms, dist, also))

    for known in KNOWN_ACCELERATORS:
        nodes = find_nodes(known.nodes)
        if not nodes:
            continue
        joining = tuple(name for name, found in claimed.items() if set(found) & set(nodes) and name != known.platform)
        for name in joining:
            del claimed[name]
        claimed.pop(known.platform, None)
        platforms = (known.platform, *joining)
        consider(known.vendor, nodes, known.visible_devices_env, platforms, known.distribution, known.also_made_by)
    for name, nodes in claimed.items():
        if nodes:
            consider(None, nodes, claims[name].visible_devices_env, (name,), None)
    return tuple(present), tuple(hidden)
