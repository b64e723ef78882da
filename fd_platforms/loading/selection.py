"""Choose the platform: ``FD_PLATFORM``, ``FD_PLATFORM_PLUGINS``, detection, and the cpu fallback.

- ``FD_PLATFORM=<name>`` imports only that plugin; unknown, excluded, broken or undetected is a
  hard error, never a silent fallback.
- Unset: every allowed plugin is imported and detected; one available is selected, several are an
  error asking for ``FD_PLATFORM``. None available selects the built-in ``cpu`` (one INFO line says
  why) only where no accelerator is present (:mod:`.accelerators`): where an accelerator's device
  nodes are, and nothing can drive it, selection is an :class:`~fd_platforms.contract.errors.AcceleratorUnusableError`
  naming the nodes, each platform that would drive them with its reason, and the fix (``FD_PLATFORM=cpu``
  to run on the host on purpose).
- ``FD_PLATFORM_PLUGINS=a,b`` limits the external plugins considered; the built-in cpu is always there.
- The plugins not named are loaded, detected and confirmed in a child process, one after another
  (:mod:`.screening`); only the one selected is then imported here. A plugin that fails to import
  or detect, hangs past ``FD_PLATFORM_DETECT_TIMEOUT``, ends the child or shares its name with
  another distribution is recorded as broken and never stops the others.
- The named plugin (``FD_PLATFORM``) is imported, detected and confirmed here, in the caller's
  thread: a hang there ends the process, naming the call (:mod:`.watchdog`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from ..contract.errors import (
    AcceleratorUnusableError,
    AmbiguousPlatformError,
    DuplicatePlatformError,
    FdPlatformsError,
    PlatformUnavailableError,
    SelectionError,
    UnknownPlatformError,
)
from ..contract.types import Detection, PlatformReport, PlatformStatus, SelectedHow
from .accelerators import NodeClaim, PresentAccelerator, node_claim, present_accelerators
from .discovery import Candidate, discover
from .platform import Platform, load_platform
from .screening import screen
from .watchdog import DEFAULT_DETECT_TIMEOUT, detect_bound

ENV_PLATFORM = "FD_PLATFORM"
ENV_PLUGINS = "FD_PLATFORM_PLUGINS"
FALLBACK_PLATFORM = "cpu"
IN_REPO_PLUGINS = ("cuda", "xpu", "iluvatar", "metax", "dcu", "gcu", "intel_hpu", "npu")

logger = logging.getLogger("fd_platforms")


@dataclass(frozen=True)
class Selection:
    """The chosen platform, how it was chosen (``env``, ``detected``, ``fallback``) and why;
    ``present``: the accelerators found here when cpu was chosen on purpose (``FD_PLATFORM=cpu``)."""

    platform: Platform
    how: SelectedHow
    reason: str
    present: tuple[PresentAccelerator, ...] = ()


@dataclass(frozen=True)
class Probe:
    """One candidate after import and detection: a platform and its detection, or the error.

    A platform detected in a child process (:mod:`.screening`) has its detection, device type and
    node claim but no ``platform`` here until it is chosen (:meth:`Prober.load` loads it then)."""

    candidate: Candidate
    platform: Platform | None = None
    detection: Detection | None = None
    error: FdPlatformsError | None = None
    device_type: str | None = None
    claim: NodeClaim | None = None

    @property
    def available(self) -> bool:
        return self.detection is not None and self.detection.available

    @property
    def reason(self) -> str:
        """Detection's reason, or the error that made the platform broken."""
        return str(self.error) if self.detection is None else self.detection.reason

    def loaded(self) -> Platform:
        """The platform loaded here, or the error that broke it raised."""
        if self.platform is None:
            assert self.error is not None, f"{self.candidate.name} was detected in the child, not loaded: Prober.load"
            raise self.error
        return self.platform


@dataclass
class Prober:
    """Imports and detects each platform at most once, keeping broken ones as records."""

    found: dict[str, list[Candidate]] = field(default_factory=discover)
    probes: dict[str, Probe] = field(default_factory=dict)
    confirmed: set[str] = field(default_factory=set)
    screen: bool = True
    """Load, detect and confirm the plugins not named in a child process (:mod:`.screening`), not here."""
    on_loaded: Callable[[str, NodeClaim | None], None] | None = None
    """Told each platform's node claim once its plugin has loaded, before its detection runs (the screening child
    reports it then, so a detection that hangs or ends the child still leaves the claim known)."""

    def probe(self, name: str) -> Probe:
        """Load and detect the single candidate registered as ``name``, here: it is the one asked for."""
        return self.probe_all([name], here=True)[name]

    def probe_all(self, names: Iterable[str], *, here: bool = False) -> dict[str, Probe]:
        """Load and detect each of ``names`` once: plugins (not the built-in platforms) in the screening
        child, which confirms those available too, unless ``here`` or :attr:`screen` is off; the rest
        here, in the caller's thread, one after another. A name several distributions register is broken.
        """
        names = list(names)
        screened: list[Candidate] = []
        for name in names:
            if name in self.probes:
                continue
            candidates = self.found[name]
            if len(candidates) > 1:
                self.probes[name] = Probe(candidates[0], error=duplicate_error(name, candidates))
            elif self.screen and not here and not candidates[0].builtin:
                screened.append(candidates[0])
            else:
                self.probes[name] = _load_and_detect(candidates[0], self.on_loaded)
        if screened:
            bound = detect_bound().seconds or DEFAULT_DETECT_TIMEOUT  # the child is bounded even where we are not
            results = screen(screened, bound)
            for candidate in screened:
                found = results[candidate.name]
                self.probes[candidate.name] = Probe(
                    candidate, None, found.detection, found.error, found.device_type, found.claim
                )
                if found.detection is not None and found.detection.available:
                    self.confirmed.add(candidate.name)  # the child confirmed it
        return {name: self.probes[name] for name in names}

    def confirm(self, name: str) -> Probe:
        """Probe ``name`` and, if it is available, confirm it through its ``confirm_platform`` hook.

        The confirmed detection replaces the cheap one (or the error marks the platform broken),
        so reports show what Paddle said. Each platform is confirmed at most once, here or in the
        screening child.
        """
        probe = self.probe(name)
        if not probe.available or name in self.confirmed:
            return probe
        self.confirmed.add(name)
        try:
            confirmed = probe.loaded().confirm()  # probed here: loaded
        except FdPlatformsError as exc:
            self.probes[name] = Probe(probe.candidate, error=exc, claim=probe.claim)
        else:
            self.probes[name] = replace(probe, detection=confirmed or probe.detection)
        return self.probes[name]

    def load(self, name: str) -> Probe:
        """``name``'s probe with its platform loaded here: one the screening child detected is imported
        now that it is chosen (its error, should this import fail, marks it broken)."""
        probe = self.probes[name]
        if probe.platform is None and probe.error is None:
            try:
                probe = replace(probe, platform=load_platform(probe.candidate))
            except FdPlatformsError as exc:
                probe = Probe(probe.candidate, error=exc, claim=probe.claim)
            self.probes[name] = probe
        return probe


def _load_and_detect(candidate: Candidate, on_loaded: Callable[[str, NodeClaim | None], None] | None) -> Probe:
    try:
        platform = load_platform(candidate)
    except FdPlatformsError as exc:
        return Probe(candidate, error=exc)
    claim = node_claim(platform.manager.get_plugin(candidate.name))
    if on_loaded is not None:
        on_loaded(candidate.name, claim)
    try:
        return Probe(candidate, platform, platform.detect(), claim=claim)
    except FdPlatformsError as exc:
        return Probe(candidate, error=exc, claim=claim)


def single_candidate(found: Mapping[str, list[Candidate]], name: str) -> Candidate:
    """The one candidate registered as ``name``; two distributions registering it is an error."""
    candidates = found[name]
    if len(candidates) > 1:
        raise duplicate_error(name, candidates)
    return candidates[0]


def duplicate_error(name: str, candidates: list[Candidate]) -> DuplicatePlatformError:
    """The error for one platform name registered by several distributions, naming them all."""
    dists = " and ".join(f"{c.distribution} {c.version}" for c in candidates)
    return DuplicatePlatformError(
        f"platform name {name!r} is registered by {len(candidates)} distributions: {dists}. "
        "Fix: uninstall all but one of them (pip uninstall <distribution>)"
    )


def allowed_names(found: Mapping[str, list[Candidate]], environ: Mapping[str, str]) -> list[str]:
    """Platform names ``FD_PLATFORM_PLUGINS`` lets through (all when unset); cpu is always in."""
    raw = environ.get(ENV_PLUGINS)
    if raw is None:
        return list(found)
    wanted = [name.strip() for name in raw.split(",") if name.strip()]
    for name in wanted:
        if name not in found:
            raise UnknownPlatformError(
                ENV_PLUGINS, name, found, f"remove {name!r} from {ENV_PLUGINS} or {_install_hint(name)}"
            )
    return [name for name in found if name == FALLBACK_PLATFORM or name in wanted]


def select_platform(
    environ: Mapping[str, str] | None = None, prober: Prober | None = None, *, named_by: str = ENV_PLATFORM
) -> Selection:
    """Apply the selection rules to ``environ`` (default ``os.environ``); no caching. ``named_by``: what the user
    named the platform with, for messages (a command's ``--platform`` puts its value in ``FD_PLATFORM``)."""
    env = dict(os.environ if environ is None else environ)  # read once: a plugin loaded below cannot change it
    prober = prober or Prober()
    allowed = allowed_names(prober.found, env)
    requested = env.get(ENV_PLATFORM, "").strip()
    if requested:
        return _select_requested(requested, allowed, prober, env, named_by)
    # Cheap detection for every platform at once; Paddle confirms only those that detected a runtime.
    accelerators = [name for name in allowed if name != FALLBACK_PLATFORM]
    prober.probe_all(accelerators)
    probes = [prober.confirm(name) for name in accelerators]
    for probe in probes:
        if probe.error is not None:
            logger.warning("skipping broken platform plugin: %s", probe.error)
    available = [probe for probe in probes if probe.available]
    if len(available) == 1:
        chosen = prober.load(available[0].candidate.name)
        return Selection(chosen.loaded(), "detected", f"only platform detected: {chosen.reason}")
    if len(available) > 1:
        listing = "; ".join(f"{p.candidate.name} ({p.reason})" for p in available)
        names = ", ".join(p.candidate.name for p in available)
        raise AmbiguousPlatformError(
            f"several platforms are available: {listing}. Fix: set {ENV_PLATFORM} to one of: {names}"
        )
    fallback = prober.probe(FALLBACK_PLATFORM).loaded()
    present, hidden = present_accelerators(env, {p.candidate.name: p.claim for p in probes if p.claim is not None})
    if present:
        raise unusable_error(present, prober, allowed, env)
    broken = [p.candidate.name for p in probes if p.error is not None]
    unavailable = [p.candidate.name for p in probes if p.error is None]
    parts = [
        f"{', '.join(unavailable)} not available" if unavailable else "",
        f"{', '.join(broken)} broken" if broken else "",
        *(found.describe() for found in hidden),
    ]
    reason = "no accelerator platform detected: " + (
        "; ".join(part for part in parts if part) or "no plugin considered"
    )
    logger.info("using the built-in cpu platform (%s)", reason)
    return Selection(fallback, "fallback", reason)


def unusable_error(
    present: tuple[PresentAccelerator, ...], prober: Prober, allowed: list[str], env: Mapping[str, str]
) -> AcceleratorUnusableError:
    """The error for accelerators present here that no platform can drive: per accelerator its nodes,
    and per platform that would drive them why it cannot (not installed, excluded, unavailable, broken)."""
    accounts = [
        f"{accelerator.describe()}, but no platform can use it: "
        + "; ".join(_why_not(name, accelerator, prober, allowed, env) for name in accelerator.platforms)
        for accelerator in present
    ]
    on_purpose = f"To run on the host's memory on purpose instead, set {ENV_PLATFORM}={FALLBACK_PLATFORM}"
    return AcceleratorUnusableError(f"{'; '.join(accounts)}. {on_purpose}")


def _why_not(
    name: str, accelerator: PresentAccelerator, prober: Prober, allowed: list[str], env: Mapping[str, str]
) -> str:
    """Why platform ``name`` cannot drive ``accelerator`` here, with the fix."""
    candidates = prober.found.get(name)
    if not candidates:
        distribution = f" ({accelerator.distribution})" if accelerator.distribution else ""
        return f"no installed plugin provides platform {name}. Fix: {_install_hint(name)}{distribution}"
    label = f"platform {name} ({candidates[0].distribution} {candidates[0].version})"
    if name not in allowed:
        return f"{label} is excluded by {ENV_PLUGINS}={env.get(ENV_PLUGINS)!r}. Fix: add {name} to it"
    probe = prober.probes[name]  # every allowed plugin was probed before the fallback
    return f"{label} is {'broken' if probe.error is not None else 'unavailable'}: {probe.reason}"


def _select_requested(
    requested: str, allowed: list[str], prober: Prober, env: Mapping[str, str], named_by: str = ENV_PLATFORM
) -> Selection:
    if requested not in prober.found:
        raise UnknownPlatformError(
            named_by, requested, prober.found, f"set {named_by} to one of them, or {_install_hint(requested)}"
        )
    if requested not in allowed:
        raise SelectionError(
            f"{named_by}={requested!r} is excluded by {ENV_PLUGINS}={env.get(ENV_PLUGINS)!r}. "
            f"Fix: add {requested} to {ENV_PLUGINS} or unset it"
        )
    single_candidate(prober.found, requested)  # a duplicate of the requested name is refused unimported
    probe = prober.confirm(requested)
    if probe.available:
        probe = prober.load(requested)
    if probe.error is not None:
        raise probe.error
    if not probe.available:
        raise PlatformUnavailableError(
            f"{named_by}={requested!r} selects {probe.candidate.distribution} {probe.candidate.version}, "
            f"which is not available here: {probe.reason} "
            f"(or {_leave_out(named_by)} to use what is detected, cpu when nothing is)"
        )
    present = present_accelerators(env)[0] if requested == FALLBACK_PLATFORM else ()
    if not present:
        return Selection(probe.loaded(), "env", f"{ENV_PLATFORM}={requested}")
    reason = f"{ENV_PLATFORM}={requested}: the host's memory, on purpose; " + "; ".join(
        accelerator.describe() for accelerator in present
    )
    logger.info("using the built-in cpu platform (%s)", reason)
    return Selection(probe.loaded(), "env", reason, present)


def _leave_out(named_by: str) -> str:
    """How to stop naming the platform: ``unset FD_PLATFORM``, or ``leave out --platform``."""
    return f"leave out {named_by}" if named_by.startswith("-") else f"unset {named_by}"


def _install_hint(name: str) -> str:
    if name in IN_REPO_PLUGINS:
        return f"install the in-repo plugin: pip install ./plugins/{name}"
    return (
        f"install the distribution that provides platform {name!r} "
        f"(in-repo plugins: pip install ./plugins/<name> for {', '.join(IN_REPO_PLUGINS)})"
    )


@dataclass(frozen=True)
class Survey:
    """Every discovered platform as a report, and the selection (or why it failed)."""

    reports: list[PlatformReport]
    selection: Selection | None
    error: FdPlatformsError | None


def survey(environ: Mapping[str, str] | None = None) -> Survey:
    """Import and detect every discovered platform, then select as :func:`select_platform` would."""
    env = dict(os.environ if environ is None else environ)  # read once: a plugin loaded below cannot change it
    prober = Prober()
    try:
        allowed = allowed_names(prober.found, env)
    except FdPlatformsError:
        allowed = list(prober.found)  # the same error is reported by the selection below
    prober.probe_all(allowed)  # the plugins in one screening child
    try:
        selection, error = select_platform(env, prober), None
    except FdPlatformsError as exc:
        selection, error = None, exc
    reports = [report for name in prober.found for report in _reports_for(name, name in allowed, prober)]
    return Survey(reports, selection, error)


def _reports_for(name: str, allowed: bool, prober: Prober) -> list[PlatformReport]:
    candidates = prober.found[name]
    if len(candidates) > 1:
        message = str(duplicate_error(name, candidates))
        return [_report(candidate, "broken", message) for candidate in candidates]
    if not allowed:
        return [_report(candidates[0], "excluded", f"not listed in {ENV_PLUGINS}")]
    probe = prober.probe(name)
    if probe.detection is None:
        return [_report(probe.candidate, "broken", probe.reason)]
    status: PlatformStatus = "available" if probe.available else "unavailable"
    device_type = probe.device_type if probe.platform is None else probe.platform.identity.device_type
    return [_report(probe.candidate, status, probe.reason, probe.detection.device_count, device_type)]


def _report(
    candidate: Candidate, status: PlatformStatus, reason: str, device_count: int = 0, device_type: str | None = None
) -> PlatformReport:
    return PlatformReport(
        name=candidate.name,
        distribution=candidate.distribution,
        version=candidate.version,
        entry_point=candidate.entry_point.value,
        builtin=candidate.builtin,
        status=status,
        reason=reason,
        device_count=device_count,
        device_type=device_type,
    )
