"""Which version of the create-or-attach rule our processes follow beside FastDeploy's.

FastDeploy's IPC has no word that says who creates the KV cache. Its runner decides by the rule of
its own release (``fastdeploy/worker/gpu_model_runner.py`` ``initialize_kv_cache``); its cache
transfer manager creates only when its engine starts it with ``--create_cache_tensor``
(``fastdeploy/cache_manager/prefix_cache_manager.py`` ``launch_cache_manager``) and otherwise waits
for the runner's records (``fastdeploy/cache_manager/cache_transfer_manager.py`` ``_init_gpu_cache``,
"Waiting for runners or messagers to create kv cache"). Since PR #7471 (2026-04-29) host swap space
no longer makes the runner attach, and since PR #8046 (2026-06-15) a storage backend no longer does either, so in a
mixed instance with swap space or a storage backend the releases put the cache in different processes
(:func:`~fd_platforms.rules.decision.decisions_by_version`); what each FastDeploy line runs on each platform is
:mod:`.releases`'.

There a version nobody pinned would be a guess, and a wrong guess is two processes each waiting for
the other until both time out: :func:`rule_in_force` refuses it instead, naming both versions, and
:func:`mismatch_hint` gives a wait that times out there the other version to suspect. We do not
read FastDeploy's installed version instead: a version number does not tell whether a build
carries PR #7471 (forks and development builds), and our process need not be able to import
FastDeploy's package at all; refusing costs one pinned setting, a wrong guess a hung start-up.
"""

from __future__ import annotations

from dataclasses import replace

from ..contract.errors import ConfigError
from ..rules.decision import (
    BUILTIN_VERSIONS,
    DEFAULT_RULE,
    RULE_VERSIONS,
    DecisionInputs,
    check_rule,
    decisions_by_version,
)
from ..rules.roles import cache_roles

FASTDEPLOYS = tuple(version.name for version in BUILTIN_VERSIONS)
"""The versions FastDeploy's processes may follow: the built-in ones (an engine's own version is no FastDeploy's)."""

FASTDEPLOY_RULE = "2026-04"
"""The rule FastDeploy follows since PR #7471 (2026-04-29; develop c1b7c083, the release the porting guide ports:
``gpu_model_runner.py`` ``initialize_kv_cache`` creates unless a storage backend or P/D says otherwise). A port of
that release pins it (``from_fd_config(..., rule=FASTDEPLOY_RULE)``), so its processes and any of FastDeploy's
own left unported decide alike; a port of an older release pins ``"2026-01"``."""
HOW_TO_PIN = "rule= in the Python API, --rule on the command line, rule under [cache] in the deploy file"


def rule_in_force(rule: str | None, inputs: DecisionInputs, field: str = "rule") -> str:
    """``rule`` where pinned; else the default version where every version decides alike on
    ``inputs``; else a ConfigError naming ``field``, both versions, which FastDeploy follows each, and
    how to pin one."""
    if rule is not None:
        return check_rule(rule, field).name
    answers = decisions_by_version(inputs, *FASTDEPLOYS)
    if answers is None:
        return DEFAULT_RULE
    raise ConfigError(
        field,
        None,
        f"a pinned version here: with {_case(inputs)} the rule's versions decide differently and FastDeploy's "
        "signals do not say which its processes follow: "
        + "; ".join(f"{_version(name)}: {_who_creates(inputs, name)}" for name in answers),
        f"pin the rule version of the FastDeploy beside this engine, the same in every process of ours: {HOW_TO_PIN}",
    )


def mismatch_hint(rule: str, inputs: DecisionInputs) -> str:
    """For a wait on FastDeploy's side that timed out under the pinned ``rule``: where another version
    decides otherwise on ``inputs``, that a FastDeploy following it would be waiting for us too, and
    the fix; "" where every version decides alike."""
    answers = decisions_by_version(inputs, *dict.fromkeys((rule, *FASTDEPLOYS)))
    if answers is None:
        return ""
    others = [name for name, answer in answers.items() if answer.create != answers[rule].create]
    return (
        f"Or the rule differs: this process follows the pinned rule {_version(rule)}, under which "
        f"{_who_creates(inputs, rule)}, but "
        + "; ".join(f"under rule {_version(name)} {_who_creates(inputs, name)}" for name in others)
        + ": if the FastDeploy beside it follows that, each side waits for the other. Fix: then pin rule "
        + " or ".join(others)
        + f" in every process of ours ({HOW_TO_PIN})"
    )


def _case(inputs: DecisionInputs) -> str:
    swap = f"host swap space (num_cpu_blocks={inputs.num_cpu_blocks})" if inputs.num_cpu_blocks else "no swap space"
    backend = f"storage backend {inputs.storage_backend}" if inputs.storage_backend else "no storage backend"
    return f"{swap}, {backend} and role {inputs.splitwise_role}"


def _version(name: str) -> str:
    return f"{name} ({RULE_VERSIONS[name].fastdeploy})"


def _who_creates(inputs: DecisionInputs, rule: str) -> str:
    return str(cache_roles(replace(inputs, rule=rule)))
