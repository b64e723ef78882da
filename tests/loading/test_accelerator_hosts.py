"""On a host with an accelerator: never a silent cpu fallback, never paddle at registration, the install hint shown.

Three layers: the table of known device nodes and what a visibility variable hides (with the node
finder replaced); selection in this process on such a host; and the commands themselves run as on a
real host, in a private mount namespace whose ``/dev`` holds ``nvidia0``, with no Paddle or Paddle's
CPU build, under pluggy's registration as 1.7 and as 1.5/1.6 do it (:mod:`accelerator_host`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from fnmatch import fnmatch
from pathlib import Path

import pytest
from accelerator_host import host_command, skip_without_namespaces
from run_helpers import QWEN, ROOT, SCRIPT, clean_env

from fd_platforms.contract.errors import (
    AcceleratorUnusableError,
    DeviceFactsUnavailableError,
    HostAllocError,
    PaddleUnavailableError,
)
from fd_platforms.loading import accelerators
from fd_platforms.loading.accelerators import KNOWN_ACCELERATORS, NodeClaim, present_accelerators
from fd_platforms.loading.discovery import discover
from fd_platforms.loading.isolation import call_plugin
from fd_platforms.loading.platform import register_platform
from fd_platforms.loading.selection import Prober, select_platform
from fd_platforms.loading.watchdog import detect_bound

NodeTable = Mapping[str, tuple[str, ...]]
CUDA_HINT = "pip install paddlepaddle-gpu"


@pytest.fixture
def host_nodes(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``host_nodes(**{glob: nodes})``: the device nodes this host has, by the glob that finds them."""

    def use(table: NodeTable) -> None:
        monkeypatch.setattr(accelerators, "find_nodes", lambda pattern: table.get(pattern, ()))

    return use


NVIDIA = {"/dev/nvidia[0-9]*": ("/dev/nvidia0", "/dev/nvidia1")}


# The table and what hides it


def test_each_in_repo_plugin_states_the_nodes_the_table_knows_for_it() -> None:
    """The cuda, xpu, iluvatar, intel_hpu and npu records claim exactly the table's nodes; MetaX's and
    dcu's state none (their GPUs are /dev/dri render nodes any vendor's GPU has: the table knows their
    control node), nor gcu's (its cards' nodes share their prefix with its codec nodes)."""
    assert {known.platform for known in KNOWN_ACCELERATORS} == {
        "cuda",
        "xpu",
        "iluvatar",
        "metax",
        "dcu",
        "gcu",
        "intel_hpu",
        "npu",
    }
    for known in KNOWN_ACCELERATORS:
        [candidate] = discover()[known.platform]
        assert candidate.distribution == known.distribution
        claim = accelerators.node_claim(candidate.load())
        if known.platform in ("cuda", "xpu", "iluvatar", "intel_hpu", "npu"):
            assert claim == NodeClaim(known.nodes, known.visible_devices_env)
        else:
            assert claim is None


@pytest.mark.parametrize(
    ("environ", "present"),
    [
        ({}, True),
        ({"CUDA_VISIBLE_DEVICES": "1"}, True),
        ({"CUDA_VISIBLE_DEVICES": ""}, False),
        ({"CUDA_VISIBLE_DEVICES": "-1"}, False),
        ({"CUDA_VISIBLE_DEVICES": " , "}, False),
        ({"XPU_VISIBLE_DEVICES": ""}, True),
    ],
    ids=["unset", "one-listed", "empty", "minus-one", "only-commas", "another-vendors-variable"],
)
def test_a_visibility_variable_that_hides_every_device_leaves_no_accelerator(host_nodes, environ, present) -> None:
    host_nodes(NVIDIA)
    found, hidden = present_accelerators(environ)
    assert bool(found) is present and bool(hidden) is not present
    if present:
        assert found[0].vendor == "NVIDIA" and found[0].nodes == NVIDIA["/dev/nvidia[0-9]*"]
        assert found[0].platforms == ("cuda",) and found[0].distribution == "fd-platforms-cuda"
    else:
        assert hidden[0].variable == "CUDA_VISIBLE_DEVICES"


def test_metax_is_known_by_its_control_node(host_nodes) -> None:
    host_nodes({"/dev/mxcd": ("/dev/mxcd",)})
    [found], _ = present_accelerators({})
    assert (found.vendor, found.platforms) == ("MetaX", ("metax",))
    assert present_accelerators({"MACA_VISIBLE_DEVICES": ""})[0] == ()


@pytest.mark.parametrize(
    ("nodes", "vendor", "platform", "variable"),
    [
        ({"/dev/kfd": ("/dev/kfd",)}, "ROCm (Hygon DCU, AMD)", "dcu", "HIP_VISIBLE_DEVICES"),
        ({"/dev/gcu[0-9]*": ("/dev/gcu0", "/dev/gcu0vid0")}, "Enflame", "gcu", "TOPS_VISIBLE_DEVICES"),
        (
            {"/dev/accel/accel_controlD[0-9]*": ("/dev/accel/accel_controlD0",)},
            "Intel Gaudi",
            "intel_hpu",
            "HABANA_VISIBLE_MODULES",
        ),
        ({"/dev/davinci[0-9]*": ("/dev/davinci0", "/dev/davinci1")}, "Ascend", "npu", "ASCEND_RT_VISIBLE_DEVICES"),
    ],
    ids=["dcu", "gcu", "intel_hpu", "npu"],
)
def test_fastdeploys_other_accelerators_are_known_by_their_nodes_and_hidden_by_their_variable(
    host_nodes, nodes: NodeTable, vendor: str, platform: str, variable: str
) -> None:
    host_nodes(nodes)
    [found], _ = present_accelerators({})
    assert (found.vendor, found.platforms, found.nodes) == (vendor, (platform,), next(iter(nodes.values())))
    assert found.distribution == f"fd-platforms-{platform.replace('_', '-')}"
    assert present_accelerators({"CUDA_VISIBLE_DEVICES": ""})[0] == (found,), "another vendor's variable hides nothing"
    found_none, [hidden] = present_accelerators({variable: "-1"})
    assert found_none == () and (hidden.vendor, hidden.variable) == (vendor, variable)


def test_the_accel_class_and_render_nodes_alone_mark_no_vendor(monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/accel/accelN (other vendors' NPUs use that class too) and /dev/dri render nodes are no vendor's:
    neither the table nor an installed plugin's glob finds an accelerator in them."""
    shared = ("/dev/accel/accel0", "/dev/dri/renderD128")
    monkeypatch.setattr(accelerators, "find_nodes", lambda pattern: tuple(n for n in shared if fnmatch(n, pattern)))
    claims = {
        name: claim
        for name, [candidate, *_] in discover().items()
        if name != "cpu" and (claim := accelerators.node_claim(candidate.load())) is not None
    }
    assert {"intel_hpu", "npu"} <= set(claims)
    assert present_accelerators({}, claims) == ((), ())


def test_a_plugin_claiming_known_nodes_joins_that_accelerator_and_one_claiming_others_stands_alone(host_nodes) -> None:
    host_nodes({**NVIDIA, "/dev/nvidia*": ("/dev/nvidia0", "/dev/nvidiactl"), "/dev/zephyr[0-9]*": ("/dev/zephyr0",)})
    claims = {"mycuda": NodeClaim("/dev/nvidia*", None), "zephyr": NodeClaim("/dev/zephyr[0-9]*", "ZEPHYR_VISIBLE")}
    found, _ = present_accelerators({}, claims)
    assert [(f.vendor, f.platforms) for f in found] == [("NVIDIA", ("cuda", "mycuda")), (None, ("zephyr",))]
    assert found[1].describe() == "devices that platform zephyr drives are present here (/dev/zephyr0)"
    assert [f.platforms for f in present_accelerators({"ZEPHYR_VISIBLE": ""}, claims)[0]] == [("cuda", "mycuda")]


def test_the_description_names_the_vendor_and_at_most_four_nodes(host_nodes) -> None:
    host_nodes({"/dev/nvidia[0-9]*": tuple(f"/dev/nvidia{n}" for n in range(8))})
    [found], _ = present_accelerators({})
    assert found.describe() == (
        "NVIDIA devices are present here (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2, /dev/nvidia3 and 4 more)"
    )


# Selection in this process


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_an_accelerator_no_platform_can_use_is_an_error_naming_nodes_plugin_reason_and_fix(host_nodes) -> None:
    host_nodes(NVIDIA)
    with pytest.raises(AcceleratorUnusableError) as info:
        select_platform({})
    message = str(info.value)
    assert message.startswith("NVIDIA devices are present here (/dev/nvidia0, /dev/nvidia1), but no platform")
    assert "platform cuda (fd-platforms-cuda 0.1.0) is unavailable: paddlepaddle-gpu is not installed" in message
    assert "the CPU build" in message and CUDA_HINT in message and message.endswith("set FD_PLATFORM=cpu")
    assert info.value.exit_code == 2


def test_without_device_nodes_the_cpu_fallback_is_as_before(host_nodes, caplog: pytest.LogCaptureFixture) -> None:
    host_nodes({})
    caplog.set_level(logging.INFO, logger="fd_platforms")
    selection = select_platform({})
    assert (selection.platform.name, selection.how, selection.present) == ("cpu", "fallback", ())
    assert next(r.getMessage() for r in caplog.records if r.levelno == logging.INFO).startswith(
        "using the built-in cpu"
    )


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_hidden_devices_fall_back_to_cpu_and_the_reason_says_what_hid_them(host_nodes) -> None:
    host_nodes(NVIDIA)
    selection = select_platform({"CUDA_VISIBLE_DEVICES": ""})
    assert selection.platform.name == "cpu"
    assert "NVIDIA devices /dev/nvidia0, /dev/nvidia1 hidden by CUDA_VISIBLE_DEVICES=''" in selection.reason


def test_fd_platform_cpu_always_works_and_says_what_is_present(host_nodes, caplog) -> None:
    host_nodes(NVIDIA)
    caplog.set_level(logging.INFO, logger="fd_platforms")
    selection = select_platform({"FD_PLATFORM": "cpu"})
    assert (selection.platform.name, selection.how) == ("cpu", "env")
    assert [found.vendor for found in selection.present] == ["NVIDIA"]
    assert selection.reason == (
        "FD_PLATFORM=cpu: the host's memory, on purpose; NVIDIA devices are present here (/dev/nvidia0, /dev/nvidia1)"
    )
    assert any("on purpose" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def test_an_excluded_plugin_is_named_with_the_allow_list(host_nodes) -> None:
    host_nodes(NVIDIA)
    with pytest.raises(
        AcceleratorUnusableError,
        match=r"platform cuda \(fd-platforms-cuda 0.1.0\) is excluded by "
        r"FD_PLATFORM_PLUGINS=''. Fix: add cuda to it",
    ):
        select_platform({"FD_PLATFORM_PLUGINS": ""})


def test_no_plugin_installed_for_known_nodes_names_the_distribution(host_nodes) -> None:
    host_nodes({"/dev/xpu[0-9]*": ("/dev/xpu0",)})
    found = {name: candidates for name, candidates in discover().items() if name != "xpu"}
    with pytest.raises(AcceleratorUnusableError) as info:
        select_platform({}, Prober(found=found))
    assert (
        "Kunlun devices are present here (/dev/xpu0), but no platform can use it: no installed plugin provides "
        "platform xpu. Fix: install the in-repo plugin: pip install ./plugins/xpu (fd-platforms-xpu)"
    ) in str(info.value)


def test_a_broken_plugin_for_present_nodes_is_named_with_its_error(host_nodes, make_plugin) -> None:
    make_plugin("cuda", dist="fd-test-second-cuda")  # two distributions register cuda: broken
    host_nodes(NVIDIA)
    with pytest.raises(
        AcceleratorUnusableError,
        match=r"platform cuda \(.*\) is broken: platform name 'cuda' is "
        r"registered by 2 distributions",
    ):
        select_platform({})


ZEPHYR = """
from fd_platforms.plugin import CustomDeviceFacts, PaddlePlatform

PLATFORM = PaddlePlatform(
    name="zephyr",
    device_type="zephyr_tpu",
    visible_devices_env="ZEPHYR_VISIBLE_DEVICES",
    distributions=("paddle-zephyr-tpu",),
    device_glob="/dev/zephyr[0-9]*",
    install_hint="pip install paddle-zephyr-tpu",
    api_versions=">=1.0,<2",
    facts=CustomDeviceFacts,
)
"""


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_plugins_own_device_glob_counts_as_an_accelerator_present(host_nodes, make_plugin) -> None:
    """A vendor plugin the table does not know: its stated nodes, screened in the child, name it."""
    make_plugin("zephyr", source=ZEPHYR, attribute="PLATFORM")
    host_nodes({"/dev/zephyr[0-9]*": ("/dev/zephyr0",)})
    with pytest.raises(
        AcceleratorUnusableError,
        match=r"devices that platform zephyr drives are present here "
        r"\(/dev/zephyr0\).*paddle-zephyr-tpu is not installed",
    ):
        select_platform({})
    assert select_platform({"ZEPHYR_VISIBLE_DEVICES": ""}).platform.name == "cpu"


BROKEN_DETECTIONS = {
    "raises": "raise RuntimeError('driver mismatch')",
    "hangs": "import time; time.sleep(600)",
    "exits": "import os; os._exit(3)",
}


@pytest.mark.parametrize("how", list(BROKEN_DETECTIONS))
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_a_plugin_whose_detection_breaks_on_a_host_with_its_own_nodes_is_refused_never_a_cpu_fallback(
    host_nodes, make_plugin, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Broken is no better than unavailable: the plugin's record has loaded (its claim is known) before its
    detection raises, hangs past its bound or ends the screening child; selection names it and its error."""
    monkeypatch.setenv("FD_PLATFORM_DETECT_TIMEOUT", "1")
    body = textwrap.indent(BROKEN_DETECTIONS[how], " " * 8)
    source = "from dataclasses import dataclass\nfrom fd_platforms.plugin import hookimpl\n" + ZEPHYR.replace(
        "PLATFORM = PaddlePlatform(", "PLATFORM = Broken("
    ).replace(
        "\nPLATFORM = Broken(",
        "\n@dataclass(frozen=True)\nclass Broken(PaddlePlatform):\n    @hookimpl\n"
        f"    def detect_platform(self, environ=None):\n{body}\n\n\nPLATFORM = Broken(",
    )
    make_plugin("zephyr", source=source, attribute="PLATFORM")
    host_nodes({"/dev/zephyr[0-9]*": ("/dev/zephyr0",)})
    with pytest.raises(AcceleratorUnusableError) as info:
        select_platform({})
    message = str(info.value)
    assert "devices that platform zephyr drives are present here (/dev/zephyr0)" in message
    assert "platform zephyr (fd-test-zephyr " in message and ") is broken: " in message
    assert {"raises": "driver mismatch", "hangs": "did not return within 1 s", "exits": "exit"}[how] in message
    assert select_platform({"FD_PLATFORM": "cpu"}).platform.name == "cpu", "cpu on purpose still works"
    assert select_platform({"ZEPHYR_VISIBLE_DEVICES": ""}).platform.name == "cpu", "its nodes hidden: nothing lost"


# A Paddle-driven platform without paddle


def no_paddle() -> None:
    raise ModuleNotFoundError("No module named 'paddle'", name="paddle")


def cuda_without_paddle():
    """The cuda record as it is on a host whose Python has no paddle, loaded as selection loads it."""
    [candidate] = discover()["cuda"]
    record = dataclasses.replace(candidate.load(), load_paddle=no_paddle)
    return call_plugin(candidate, "loading", lambda: register_platform(candidate, record), detect_bound())


def test_without_paddle_confirmation_is_unavailable_with_the_install_hint() -> None:
    detection = cuda_without_paddle().confirm()
    assert detection is not None and not detection.available
    assert (
        "platform cuda reads its device through Paddle, which cannot be imported here (ModuleNotFoundError: No "
        "module named 'paddle'). Fix: pip install paddlepaddle-gpu" in detection.reason
    )


def test_without_paddle_device_facts_are_a_typed_error_naming_the_platform_and_fix() -> None:
    with pytest.raises(PaddleUnavailableError, match=f"platform cuda reads .* Fix: {CUDA_HINT}") as info:
        cuda_without_paddle().device_memory(0)
    assert isinstance(info.value, DeviceFactsUnavailableError) and info.value.exit_code == 2


def test_without_paddle_host_memory_is_pageable_and_pinned_is_refused_with_the_reason() -> None:
    platform = cuda_without_paddle()
    with platform.host_alloc(4096) as buffer:
        assert (buffer.pinned, buffer.nbytes) == (False, 4096)
    with pytest.raises(HostAllocError, match=f"cannot pin here: platform cuda reads .* Fix: {CUDA_HINT}"):
        platform.host_alloc(4096, require_pinned=True)


REGISTRATION = textwrap.dedent("""
    import json, sys
    from fd_platforms.loading.discovery import discover
    from fd_platforms.loading.platform import load_platform
    from fd_platforms.loading.selection import Prober
    found = {}
    for name, [candidate] in discover().items():
        plugin = candidate.load()
        for attribute in dir(plugin):  # what pluggy 1.5 and 1.6 do on register
            getattr(plugin, attribute)
        platform = load_platform(candidate)
        found[name] = [platform.detect().available, Prober(screen=False).confirm(name).reason]
    print(json.dumps({"platforms": found, "paddle": "paddle" in sys.modules}))
""")


@pytest.mark.parametrize("pluggy_getattr", [False, True], ids=["pluggy-1.7", "pluggy-1.6"])
@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_registering_detecting_and_confirming_never_import_paddle(pluggy_getattr: bool) -> None:
    """Every installed plugin, read attribute by attribute and loaded as pluggy 1.5-1.7 register it,
    in a Python without paddle: none imports it, none is broken, each says why it is unavailable."""
    command, env = host_command([sys.executable, "-c", REGISTRATION], paddle=False, pluggy_getattr=pluggy_getattr)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=clean_env(**env), timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["paddle"] is False
    assert result["platforms"]["cpu"][0] is True
    assert result["platforms"]["cuda"] == [
        False,
        (
            f"paddlepaddle-gpu is not installed. Fix: {CUDA_HINT} (Paddle's "
            "CUDA build) on a machine with an NVIDIA GPU and driver"
        ),
    ]


# The commands, as on a real host


def on_nvidia_host(*argv: str, paddle: bool, pluggy_getattr: bool, **env: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run where ``/dev`` holds ``nvidia0``, with or without Paddle's CPU build."""
    command, extra = host_command(argv, nodes=("nvidia0",), paddle=paddle, pluggy_getattr=pluggy_getattr)
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=clean_env(**extra, **env), timeout=300)


def test_the_private_dev_holds_the_node_and_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    """``device_nodes.py`` reaches the real ``/dev`` through a descriptor, not a folder: it made one with ``mkdtemp``
    and exec'd, leaving an empty ``fd-test-dev-*`` in the temp folder each time (26 a run of the suite)."""
    skip_without_namespaces()
    command, _ = host_command(
        ["sh", "-c", "test -c /dev/nvidia0 && test -c /dev/null && test -d /dev/shm"], nodes=("nvidia0",)
    )
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "TMPDIR": str(tmp_path)}, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert list(tmp_path.iterdir()) == [], "the private /dev left something in the temp folder"


HOSTS = [(False, False), (False, True), (True, False), (True, True)]
HOST_IDS = ["no-paddle-pluggy-1.7", "no-paddle-pluggy-1.6", "paddle-cpu-pluggy-1.7", "paddle-cpu-pluggy-1.6"]


@pytest.mark.slow
@pytest.mark.parametrize(("paddle", "pluggy_getattr"), HOSTS, ids=HOST_IDS)
def test_on_an_nvidia_host_without_paddles_cuda_build_nothing_falls_back_silently(paddle, pluggy_getattr) -> None:
    skip_without_namespaces()
    host = {"paddle": paddle, "pluggy_getattr": pluggy_getattr}
    cpu_build = "(found paddlepaddle 3.3.1, the CPU build)" if paddle else "is not installed. Fix:"
    listed = on_nvidia_host(SCRIPT, "list", **host)
    assert listed.returncode == 2, listed.stderr
    [cuda] = [line for line in listed.stdout.splitlines() if line.startswith("cuda ")]
    assert " unavailable " in cuda and CUDA_HINT in cuda and cpu_build in cuda, cuda
    [error] = listed.stderr.splitlines()
    assert error.startswith("fd-platforms: error: NVIDIA devices are present here (/dev/nvidia0), but no platform")
    assert CUDA_HINT in error and "FD_PLATFORM=cpu" in error and "selected:" not in listed.stdout

    planned = on_nvidia_host(SCRIPT, "plan", "--model", QWEN, **host)
    assert (planned.returncode, planned.stdout, planned.stderr) == (2, "", error + "\n")

    selected = on_nvidia_host(sys.executable, "-c", "import fd_platforms; fd_platforms.current_platform()", **host)
    assert (
        selected.returncode == 1
        and "fd_platforms.contract.errors.AcceleratorUnusableError: NVIDIA devices are present here (/dev/nvidia0)"
        in selected.stderr
    )

    on_purpose = on_nvidia_host(SCRIPT, "plan", "--model", QWEN, "--device-memory", "8GiB", FD_PLATFORM="cpu", **host)
    assert on_purpose.returncode == 0, on_purpose.stderr
    assert (
        "NVIDIA devices are present here (/dev/nvidia0); FD_PLATFORM=cpu plans for the host's memory on purpose"
        in on_purpose.stdout
    )
    listed_on_purpose = on_nvidia_host(SCRIPT, "list", FD_PLATFORM="cpu", **host)
    assert (
        listed_on_purpose.returncode == 0
        and "selected: cpu (env: FD_PLATFORM=cpu: the host's memory, on "
        "purpose; NVIDIA devices are present here (/dev/nvidia0))"
        in listed_on_purpose.stdout
    )

    hidden = on_nvidia_host(SCRIPT, "plan", "--model", QWEN, "--device-memory", "8GiB", CUDA_VISIBLE_DEVICES="", **host)
    assert hidden.returncode == 0 and "platform           cpu" in hidden.stdout, hidden.stderr


@pytest.mark.slow
def test_on_a_host_without_device_nodes_or_paddle_list_falls_back_to_cpu_as_before() -> None:
    command, env = host_command([SCRIPT, "list"], paddle=False, pluggy_getattr=True)
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=clean_env(**env), timeout=300)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "\nselected: cpu (fallback: no accelerator platform detected: " in done.stdout
    assert " broken " not in done.stdout


# What the docs say


PLATFORMS_DOC = (ROOT / "docs" / "platforms.md").read_text()


def test_the_docs_table_of_known_nodes_is_the_cores() -> None:
    header = "| vendor | device nodes | platform | distribution | hidden by |\n|---|---|---|---|---|\n"
    lines = PLATFORMS_DOC.split(header)[1].split("\n\n")[0].splitlines()
    rows = [[cell.strip().strip("`") for cell in line.strip("|").split("|")] for line in lines]
    assert rows == [[k.vendor, k.nodes, k.platform, k.distribution, k.visible_devices_env] for k in KNOWN_ACCELERATORS]


@pytest.mark.slow  # starts processes (a console script, screening children or stand-ins)
def test_the_docs_error_sample_is_what_selection_says(host_nodes) -> None:
    [sample] = [line for line in PLATFORMS_DOC.splitlines() if line.startswith("fd-platforms: error: NVIDIA")]
    host_nodes({"/dev/nvidia[0-9]*": ("/dev/nvidia0",)})
    with pytest.raises(AcceleratorUnusableError) as info:
        select_platform({})
    any_version = re.compile(r"paddlepaddle \d+\.\d+\.\d+")  # the CPU build CI installs
    said = f"fd-platforms: error: {info.value}"
    assert any_version.sub("paddlepaddle X", sample) == any_version.sub("paddlepaddle X", said)


def test_a_host_with_only_dev_kfd_is_told_a_display_gpu_makes_it_too_and_how_to_run_on_cpu(host_nodes) -> None:
    host_nodes({"/dev/kfd": ("/dev/kfd",)})
    found = {name: cands for name, cands in discover().items() if name != "dcu"}
    with pytest.raises(AcceleratorUnusableError) as info:
        select_platform({}, Prober(found=found))
    message = str(info.value)
    assert "ROCm (Hygon DCU, AMD) devices are present here (/dev/kfd) (Linux's amdgpu driver makes /dev/kfd" in message
    assert "an AMD desktop's integrated display GPU too" in message
    assert message.endswith("set FD_PLATFORM=cpu"), message
