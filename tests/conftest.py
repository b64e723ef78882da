"""Shared fixtures: a clean selection environment and test-only plugins exposed through real entry points."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import private_shm
import pytest
import warm_processes

import fd_platforms
from fd_platforms.ipc.process_watch import parent_pid, pid_running
from fd_platforms.ipc.shm import Segment, SegmentUnusable
from fd_platforms.lifecycle.children import START_METHOD_ENV

ISOLATED_VARS = ("FD_PLATFORM", "FD_PLATFORM_PLUGINS", "FD_CACHE_READY_TIMEOUT")
SHM_DIR = Path("/dev/shm")
LOCK_WAIT = 480  # seconds a module waits for FastDeploy's record names (pyproject's pytest timeout is 600)
TEST_SIGNAL_PREFIX = "fd_cache_ready.test-"


OUR_PREFIXES = ("fd_cache_ready.", "fd_kv_cache.")
SHARED_SHM = pytest.StashKey[str | None]()  # why this process's /dev/shm is the host's; None: it is its own


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest process (each xdist worker) gets a /dev/shm of its own where it can (tests/support/private_shm.py),
    and the ``run``s it starts fork their children from a fork server (``FD_PLATFORMS_START_METHOD``).

    Tests press Ctrl-C as a terminal does, on a foreground job. Started in the background
    (``nohup pytest &``), pytest inherits SIGINT *ignored*, every process it starts would inherit
    that too (an ignored signal survives exec), and Python then never raises KeyboardInterrupt:
    give the processes the tests start the default disposition a foreground job has."""
    config.stash[SHARED_SHM] = private_shm.enter()
    os.environ[START_METHOD_ENV] = "forkserver"  # every run forks its children from one warm server (run_helpers.KEPT)
    if "PYTEST_XDIST_WORKER" not in os.environ:  # the run's first process: the controller, or the only one
        config.stash[TEMP_BEFORE] = temp_entries()
    keep_bytecode(config)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


TEMP_NAMES = ("fd-test-", "fd-platforms-launch-")  # device_nodes.py's fd-test-dev-* was one; a run's launch folder
TEMP_BEFORE = pytest.StashKey[set[str]]()


def temp_entries() -> set[str]:
    """Names in the temp folder (``TMPDIR``, else ``/tmp``) that the tests' processes or the code they run choose."""
    folder = tempfile.gettempdir()
    return {name for name in os.listdir(folder) if name.startswith(TEMP_NAMES)} if os.path.isdir(folder) else set()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """A loud section, in the run's own process, naming what of ours appeared in the temp folder during the run and
    is still there. A warning, not a failure: the temp folder is the machine's, and another test run beside this
    one (another checkout, an older commit) makes the same names, which no name can tell apart. The failing check
    is each maker's own test with a ``TMPDIR`` of its own (``device_nodes.py``'s in test_accelerator_hosts.py)."""
    before = config.stash.get(TEMP_BEFORE, None)
    if before is None:
        return
    left = sorted(temp_entries() - before)
    if left:
        folder = tempfile.gettempdir()
        terminalreporter.write_sep("=", f"{len(left)} new entries of ours in {folder} (left by this run?)", red=True)
        for name in left[:20]:
            terminalreporter.write_line(f"{folder}/{name}")
        if len(left) > 20:
            terminalreporter.write_line(f"... and {len(left) - 20} more")


def keep_bytecode(config: pytest.Config) -> None:
    """Where Python writes no bytecode (``PYTHONDONTWRITEBYTECODE``), every process the tests start (an engine's
    workers, the screening child, ``python -c``) compiles every module of ours it imports again: 0.1 s of CPU
    each, over a thousand times a run. The tests keep it instead, out of the source tree as that setting wants,
    in one folder (``PYTHONPYCACHEPREFIX``) for this process, its xdist workers and every process they start:
    pytest's cache folder of this checkout (``.pytest_cache/d/bytecode``), else one of this run's."""
    if not sys.dont_write_bytecode:
        return
    cache = getattr(config, "cache", None)
    if os.environ.get("PYTHONPYCACHEPREFIX"):
        folder = os.environ["PYTHONPYCACHEPREFIX"]
    elif cache is not None:
        folder = str(cache.mkdir("bytecode"))
    else:
        folder = tempfile.mkdtemp(prefix="fd-platforms-bytecode-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix = folder
    sys.dont_write_bytecode = False
    warm_paddle_bytecode()


def warm_paddle_bytecode() -> None:
    """Paddle's bytecode in the folder before any test runs, compiled by one process (its import: 6 s of CPU).
    Cold, every process importing Paddle at once compiled it too, each as slow as the one: a run's first
    workers took longer than the ``--timeout`` of the test that started them (``test_run_cycle_faults``,
    run alone with a folder of its own). Not in an xdist worker: the controller warmed the folder it handed on."""
    spec = None if os.environ.get("PYTEST_XDIST_WORKER") else importlib.util.find_spec("paddle")
    if spec is None or spec.origin is None or Path(importlib.util.cache_from_source(spec.origin)).exists():
        return
    with contextlib.suppress(subprocess.TimeoutExpired):  # a Paddle that fails here fails the tests that import it
        subprocess.run([sys.executable, "-c", "import paddle"], capture_output=True, check=False, timeout=300)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The warm server (:mod:`warm_processes`) stops and is reaped here, so what it and its children used is in
    this process's rusage, and none of it outlives the session; first, so its coverage data is written before
    pytest-cov combines what this process's children wrote."""
    warm_processes.stop_server()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules holding ``slow`` tests (multi-process runs, seconds each) first, each module kept whole:
    xdist hands tests out in this order, so a worker that draws a long test early is not still running one
    when the other has run out of work, and a module's fixtures are set up once per worker."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


FROZEN = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Once a test has loaded Paddle, what its import made (and every other object still alive: the garbage is
    collected first) lives for the whole run: kept out of the cyclic collector (``gc.freeze``), it is no longer
    walked by each full collection (0.1 s each, about ten a run in each xdist worker), nor by the worker's exit
    (a second, which the run waited for). ``gc.get_freeze_count`` would count it object by object (15 ms a
    call): the stash says whether it is done."""
    if "paddle" in sys.modules and not item.config.stash.get(FROZEN, False):
        gc.collect()
        gc.freeze()
        item.config.stash[FROZEN] = True


def pytest_report_header(config: pytest.Config) -> str:
    """Whose /dev/shm the tests write in."""
    shared = config.stash[SHARED_SHM]
    if shared is None:
        return "/dev/shm: a private tmpfs per test process (FastDeploy's names need no lock)"
    return f"/dev/shm: the host's ({shared}); tests writing FastDeploy's names take them in turns"


def shm_entries() -> set[str]:
    """Names in ``/dev/shm`` that belong to fd-platforms (empty where there is no /dev/shm)."""
    return {entry for entry in os.listdir(SHM_DIR) if entry.startswith(OUR_PREFIXES)} if SHM_DIR.is_dir() else set()


def held_by_a_living_process(name: str) -> bool:
    """Whether some living process (in any PID namespace) holds the segment's lock."""
    try:
        segment = Segment.inspect(name)
    except (OSError, SegmentUnusable):
        return False
    try:
        return not segment.unused()
    finally:
        segment.close()


_PID = re.compile(r"(?<![0-9a-f])([1-9][0-9]{1,6})(?![0-9a-f])")


def made_by_another_living_process(name: str) -> bool:
    """Whether ``name`` carries the pid of a living process other than this one: an entry another
    test suite running beside this one is still working with (its engines and tests name their
    entries with their pid), not one this suite left behind."""
    return any(pid != os.getpid() and pid_running(pid) for pid in map(int, _PID.findall(name)))


def descends_from_this_process(pid: int) -> bool:
    """Whether ``pid`` is this process or one of its descendants (following parents in /proc)."""
    seen: set[int] = set()
    while pid > 0 and pid not in seen:
        if pid == os.getpid():
            return True
        seen.add(pid)
        parent = parent_pid(pid)
        if parent is None:
            return False
        pid = parent
    return False


class ForeignEntries(threading.Thread):
    """While the suite runs, the new entries another suite made: when one appeared (looked for every
    0.1 s), every pid in its name was a living process that does not descend from this session. Such
    an entry may outlive its maker (an engine another suite killed, swept by that suite later)."""

    def __init__(self, before: set[str]) -> None:
        super().__init__(name="foreign /dev/shm entries", daemon=True)
        self.seen, self.found, self.done = set(before), set(), threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            for name in shm_entries() - self.seen:
                self.seen.add(name)
                pids = [int(pid) for pid in _PID.findall(name)]
                if pids and all(pid_running(pid) and not descends_from_this_process(pid) for pid in pids):
                    self.found.add(name)


def process_tree(pids: set[int], done: threading.Event) -> None:
    """Add to ``pids`` every process that descends from one of them, until ``done`` (polling /proc
    every 50 ms: a process that lives less is missed)."""
    while not done.is_set():
        parents = {
            pid: parent
            for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if (parent := parent_pid(pid)) is not None
        }
        for pid in parents:
            chain, seen = pid, set()
            while chain in parents and chain not in seen:
                if chain in pids:
                    pids.add(pid)
                    break
                seen.add(chain)
                chain = parents[chain]
        done.wait(0.05)  # an engine process lives far longer


def run_tracked(
    command: list[str], *, cwd: Path, env: dict[str, str], timeout: float
) -> tuple[subprocess.CompletedProcess[str], set[int]]:
    """``command`` run to the end (its output captured), and the pids of it and every process it started."""
    process = subprocess.Popen(command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids, done = {process.pid}, threading.Event()
    watcher = threading.Thread(target=process_tree, args=(pids, done), daemon=True)
    watcher.start()
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        done.set()
        watcher.join()
        if process.returncode is None:
            process.kill()
            process.communicate()
    return subprocess.CompletedProcess(process.args, process.returncode, out, err), pids


def left_behind_by(pids: set[int], before: set[str]) -> list[str]:
    """Our /dev/shm entries that appeared since ``before``, that no living process holds, and that are
    these processes' doing: a pid of theirs in the name, or no pid at all (a name the code chose; the
    tests' own ``fd_cache_ready.test-`` names excepted). A suite running beside this one kills engines
    and sweeps after them: their entries carry other pids."""

    def theirs(name: str) -> bool:
        found = {int(pid) for pid in _PID.findall(name)}
        return bool(found & pids) if found else not name.startswith(TEST_SIGNAL_PREFIX)

    return sorted(name for name in shm_entries() - before if theirs(name) and not held_by_a_living_process(name))


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind(pytestconfig: pytest.Config) -> Iterator[None]:
    """The suite leaves no cache-ready segment behind: every new entry is gone or held by a living process.

    In a private /dev/shm that is every entry this test process's tests made. In the host's, a segment
    some other live process holds (an engine, or a second test run on the same machine) is not this
    suite's doing and is ignored, as is one another suite's process made.
    """
    before = shm_entries()
    foreign = ForeignEntries(before)
    if pytestconfig.stash[SHARED_SHM] is not None:  # no other suite writes in a private /dev/shm
        foreign.start()
    yield
    foreign.done.set()
    if foreign.is_alive():
        foreign.join()
    left = sorted(
        name
        for name in shm_entries() - before - foreign.found
        if not held_by_a_living_process(name) and not made_by_another_living_process(name)
    )
    assert not left, f"the test suite left shared memory behind: {left}"


@pytest.fixture
def fastdeploy_suffix(fastdeploy_record_names: None) -> Iterator[str]:
    """FastDeploy's signals for one rank under a suffix of this test's, as its engine creates them (what
    ``fd-platforms run --protocol fastdeploy`` makes: ``FASTDEPLOY.create_signals``); removed after. Its records are
    named as FastDeploy's, so the module takes them in turns (``fastdeploy_record_names``)."""
    from fd_platforms.fastdeploy import FASTDEPLOY

    name, held = FASTDEPLOY.create_signals(1, device_type="cpu", block_count_suffix=None)
    with held:
        yield name


@pytest.fixture
def signal_name() -> Iterator[str]:
    """A signal name no other test or engine uses; the test must leave no segment under it."""
    name = f"{TEST_SIGNAL_PREFIX}{uuid.uuid4().hex[:12]}"
    yield name
    assert name not in shm_entries(), f"test left /dev/shm/{name} behind"


PLUGIN_TEMPLATE = """
from fd_platforms import hookimpl
from fd_platforms.contract.types import Detection, PlatformIdentity

@hookimpl
def platform_identity():
    return PlatformIdentity({name!r}, {name!r} + "_dev", {name!r}.upper() + "_VISIBLE_DEVICES")

@hookimpl
def detect_platform():
    return Detection({available!r}, {reason!r}, {count!r})

@hookimpl
def supported_api_versions():
    return ">=1.0,<2"
"""


@pytest.fixture(autouse=True)
def clean_selection(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No fd-platforms variables from the outer environment, and no cached platform, in any test."""
    for name in ISOLATED_VARS:
        monkeypatch.delenv(name, raising=False)
    fd_platforms.reset_platform()
    yield
    fd_platforms.reset_platform()


PluginFactory = Callable[..., Path]


@pytest.fixture
def make_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PluginFactory]:
    """Install a throwaway plugin distribution: a module plus a ``*.dist-info`` with entry points.

    ``make_plugin("acme", available=True)`` registers platform ``acme`` from distribution
    ``fd-test-acme``; ``source=`` replaces the module body; ``dist=`` and ``module=`` rename them;
    ``attribute=`` points the entry point at a module attribute (``module:PLATFORM``); ``group=`` puts it in
    another entry-point group (``fd_platforms.protocols``). The folder is put on ``sys.path`` (and returned, for
    subprocesses' ``PYTHONPATH``).
    """
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    modules: list[str] = []

    def make(
        name: str,
        *,
        available: bool = True,
        reason: str = "fake device present",
        count: int = 2,
        source: str | None = None,
        dist: str | None = None,
        module: str | None = None,
        attribute: str | None = None,
        group: str = "fd_platforms",
    ) -> Path:
        dist = dist or f"fd-test-{name}"
        module = module or f"fd_test_plugin_{dist.replace('-', '_')}"
        body = (
            source
            if source is not None
            else PLUGIN_TEMPLATE.format(name=name, available=available, reason=reason, count=count)
        )
        (root / f"{module}.py").write_text(textwrap.dedent(body))
        info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        target = module if attribute is None else f"{module}:{attribute}"
        (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
        modules.append(module)
        importlib.invalidate_caches()
        return root

    yield make
    for module in modules:
        sys.modules.pop(module, None)


FAKE_DEVICE_TOOLS = Path(__file__).resolve().parent.parent / "tools" / "fake-custom-device"


def kept_folder(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """Where a build the tests share is kept: ``.pytest_cache/d/<name>`` of this checkout, so a later run loads
    it; without pytest's cache (``-p no:cacheprovider``) a folder of this run's, one for all its xdist workers."""
    cache = getattr(config, "cache", None)
    if cache is not None:
        return Path(cache.mkdir(name))
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return tmp_path_factory.mktemp(name)
    folder = tmp_path_factory.getbasetemp().parent / name  # the worker's basetemp is popen-gwN in the run's
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session", autouse=True)
def operator_cache(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Where the foreign-tensor operator is compiled (about 5 s): pytest's cache folder of this checkout
    (``.pytest_cache/d/foreign-tensor-operator``) rather than the user's cache, so a later run loads it
    again; the build's name is the key the code itself uses (the operator's source, Paddle's version
    and folder, Python's version), so an edit or another Paddle compiles anew, as does ``--cache-clear``.
    Without pytest's cache (``-p no:cacheprovider``) a folder of this run's, one for all its xdist workers
    (the compile takes a lock: one worker compiles, the other loads); FD_PLATFORMS_CACHE_DIR, where set,
    wins. The processes the tests start inherit it. Tests of the compile itself use folders of their own."""
    from fd_platforms.kit.foreign_tensor import ENV_CACHE_DIR

    given = os.environ.get(ENV_CACHE_DIR)
    folder = given or str(kept_folder(pytestconfig, tmp_path_factory, "foreign-tensor-operator"))
    os.environ[ENV_CACHE_DIR] = folder
    yield folder
    if given is None:
        os.environ.pop(ENV_CACHE_DIR, None)


@pytest.fixture(scope="module")
def fastdeploy_record_names(pytestconfig: pytest.Config) -> Iterator[None]:
    """FastDeploy's record names (``key_caches_0_rank0.device0``) are the same for every run on a machine:
    two test processes at once on the host's /dev/shm (two xdist workers, CI beside a developer's loop) would
    read, reuse and remove each other's. In a private /dev/shm (:mod:`private_shm`) they are this process's
    alone; otherwise every module that writes them takes them in turns, under one lock, waiting at most 480 s
    (under pytest-timeout's 600)."""
    if pytestconfig.stash[SHARED_SHM] is None:
        yield
        return
    path = Path(tempfile.gettempdir()) / "fd-platforms-fastdeploy-records.lock"
    with open(path, "a") as lock:
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held {path} for {LOCK_WAIT} s")
                time.sleep(0.5)
        yield


def run_build(script: str, *args: str, **env: str) -> list[str]:
    """Run one of the fake runtimes' build scripts (``tools/fake-custom-device``): the paths it printed."""
    done = subprocess.run(
        ["bash", str(FAKE_DEVICE_TOOLS / script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )
    assert done.returncode == 0, f"{script} {' '.join(args)} failed:\n{done.stderr}"
    return done.stdout.split()


@pytest.fixture(scope="session")
def fake_builds(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``fake_builds(name, build)``: the folder ``build(folder)`` filled, built once for every xdist worker
    (the first builds under a lock, the others wait and load) and kept in pytest's cache folder of this
    checkout (``.pytest_cache/d/fake-runtimes``) so a later run loads it; without pytest's cache, a folder
    of this run's. The name holds a digest of the build scripts and sources, the compiler's and
    Paddle's versions and Python: an edit or another toolchain builds anew, as does ``--cache-clear``.
    Skips where g++ is missing."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found on PATH: cannot compile the fake runtimes")
    folder = kept_folder(pytestconfig, tmp_path_factory, "fake-runtimes")
    digest = hashlib.sha256(sys.executable.encode())
    for source in sorted(FAKE_DEVICE_TOOLS.iterdir()):
        digest.update(source.name.encode() + source.read_bytes())
    compiler = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout
    digest.update(compiler.encode() + importlib.metadata.version("paddlepaddle").encode())

    def built(name: str, build: Callable[[Path], None]) -> Path:
        target = folder / f"{name}-{digest.hexdigest()[:16]}"
        with open(folder / f"{target.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_dir():
                scratch = Path(tempfile.mkdtemp(dir=folder, prefix=f".{name}-"))
                try:
                    build(scratch)
                    scratch.rename(target)  # whole or not at all: a build that failed leaves nothing to load
                finally:
                    shutil.rmtree(scratch, ignore_errors=True)
        return target

    return built


@pytest.fixture(scope="session")
def fake_device_root(fake_builds: Callable[..., Path]) -> Callable[[str], Path]:
    """``fake_device_root("iluvatar_gpu")``: a CUSTOM_DEVICE_ROOT holding only the fake runtime for that
    device type (``build.sh`` printed its path), built once (:func:`fake_builds`) for every module that uses it."""

    def check_build(device_type: str, root: Path) -> None:
        library = root / f"libfake_{device_type}.so"
        printed = run_build("build.sh", device_type, str(root), PYTHON=sys.executable)
        assert printed == [str(library)], f"build.sh printed {printed!r}"
        assert sorted(root.iterdir()) == [library], "Paddle loads every .so in CUSTOM_DEVICE_ROOT"

    return lambda device_type: fake_builds(f"fake-{device_type}", functools.partial(check_build, device_type))


def build_vendor_runtime(folder: Path) -> None:
    """``build-host-runtime.sh`` into ``folder``: it prints the two libraries it made."""
    printed = run_build("build-host-runtime.sh", str(folder))
    assert printed == [str(folder / "libcudart.so"), str(folder / "libmcruntime.so")], f"printed {printed!r}"


@pytest.fixture(scope="session")
def fake_vendor_runtime(fake_builds: Callable[..., Path]) -> Path:
    """The folder of the fake vendor runtime (``libcudart.so``, ``libmcruntime.so``: pinned host memory,
    device memory and its IPC), built once (:func:`fake_builds`); put it on LD_LIBRARY_PATH of a new process."""
    return fake_builds("fake-vendor-runtime", build_vendor_runtime)


@pytest.fixture(scope="session")
def cpu() -> fd_platforms.loading.platform.Platform:
    """The built-in cpu platform, selected by name; one for the session (a test that patches it does so through
    ``monkeypatch``, undone after the test)."""
    from fd_platforms.loading.selection import select_platform

    return select_platform({"FD_PLATFORM": "cpu"}).platform


@pytest.fixture
def cpu_for_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """``FD_PLATFORM=cpu`` for the processes the test starts, which select their platform themselves."""
    monkeypatch.setenv("FD_PLATFORM", "cpu")


@pytest.fixture
def ours(signal_name: str) -> Iterator[str]:
    """Our engine's cache-ready signal for one rank: its name, the ``instance=`` of our protocol's calls."""
    from fd_platforms.ipc.cache_signal import CacheReadySignal

    with CacheReadySignal.create(1, signal_name) as signal:
        yield signal.name
