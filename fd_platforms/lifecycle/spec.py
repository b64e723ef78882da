"""What one ``fd-platforms run`` does, as a frozen record every process of the run receives."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..contract.types import Plan, PlatformIdentity
from ..engine import CacheRequest, protocol_named
from ..fastdeploy import FASTDEPLOY  # noqa: F401 - registers protocol "fastdeploy", which [scheduler] protocol may name
from ..rules.config.deploy import DeployConfig
from ..rules.decision import RULE_VERSIONS, DecisionInputs
from ..rules.devices import physical_device_id
from ..rules.layout import CacheLayout, build_layout
from ..rules.planner import host_swap_blocks, shares_one_device

#: The most seconds the engine's phases and the children's holds add to ``timeout``, so that a wait
#: which times out is reported by the waiter itself before anyone else gives up on it; a shorter
#: ``timeout`` adds as much as itself (:attr:`RunSpec.margin`), so a stuck process fails the run
#: within twice ``--timeout`` at most. Across nodes, planning (each worker's join) and sharing the
#: report add the whole margin: there a worker's own bound names the node that is missing.
MARGIN_SECONDS = 30.0


@dataclass(frozen=True)
class NodeFlags:
    """This node's place in an engine over ``nnodes`` nodes (``--nnodes``, ``--node-rank``, ``--master``), as
    Paddle's launcher takes it (:mod:`.launcher`)."""

    nnodes: int
    node_rank: int
    master: str


@dataclass(frozen=True)
class RunSpec:
    """The deployment, the platform the engine selected, and the run's settings.

    ``platform`` is the selected platform's name (children select it through ``FD_PLATFORM``);
    ``device_type`` its Paddle device type. ``device_memory`` is the size each rank plans on
    (``--device-memory``), None for the live facts; ``host_memory`` the host memory swap space must
    fit in (``--host-memory``), None for this host's; ``timeout`` bounds every wait of the run;
    ``cycles`` how many times every rank clears and re-initializes after the first start;
    ``nodes`` where this node stands when the engine spans several (None: one node);
    ``block_count_suffix`` the suffix of FastDeploy's ``get_profile_block_num`` (``--block-count-suffix``;
    None: the run's signal suffix); ``device_ids`` each local rank's physical device id, which names its
    tensors (:func:`~fd_platforms.rules.devices.physical_device_id` of the platform's visible-devices
    variable, worked out by the engine; empty: the local device's index); ``start_method`` how the engine starts
    its children (:data:`~fd_platforms.lifecycle.children.START_METHOD_ENV`).
    """

    deploy: DeployConfig
    platform: str
    device_type: str
    ranks: int
    timeout: float
    profile: bool = False
    device_memory: int | None = None
    non_cache: int | None = None
    host_memory: int | None = None
    quiet: bool = False
    cycles: int = 0
    nodes: NodeFlags | None = None
    block_count_suffix: str | None = None
    device_ids: tuple[int, ...] = ()
    start_method: str = "spawn"

    @property
    def hold_timeout(self) -> float:
        """How long a child holding its allocation waits for the engine's stop."""
        return self.timeout + self.margin

    @property
    def margin(self) -> float:
        """What the engine's waits add to ``timeout``: :data:`MARGIN_SECONDS`, or ``timeout`` if shorter."""
        return min(MARGIN_SECONDS, self.timeout)

    @property
    def rule(self) -> str:
        """The create-or-attach rule's version every process of the run follows: the pinned one, else
        what the run's protocol makes of none on the run's inputs (beside FastDeploy, where the
        versions disagree, a ConfigError naming ``--rule``). Every process works it out alike; the
        engine first, before any process starts."""
        return rule_in_force(self.deploy, self.profile, self.layout(0).bytes_per_block)

    @property
    def shares_device(self) -> bool:
        """Whether every rank uses the one device (cpu: host memory), rather than device ``rank``."""
        return shares_one_device(self.device_type)

    def node_facts(self) -> dict[str, object]:
        """What every node of a multi-node engine must agree on, by the flag that sets it: every fact
        that changes the plan or the lifecycle (the rule's inputs and the rule itself included)."""
        assert self.nodes is not None
        cache, model = self.deploy.cache, self.deploy.model
        return {
            "--nnodes": self.nodes.nnodes,
            "--ranks": self.ranks,
            "--tp": self.deploy.parallel.tensor_parallel_size,
            "--model": model.name,
            "--attention": model.attention,
            "--mtp": model.use_mtp,
            "--platform": self.platform,
            "--block-size": cache.block_size,
            "--cache-dtype": cache.cache_dtype,
            "--kv-cache-quant-type": cache.kv_cache_quant_type,
            "--memory-utilization": cache.memory_utilization,
            "--num-gpu-blocks-override": cache.num_gpu_blocks_override,
            "--num-gpu-block-expand-ratio": cache.num_gpu_block_expand_ratio,
            "--swap-space": cache.swap_space_bytes,
            "num_cpu_blocks": cache.num_cpu_blocks,
            "--role": self.deploy.scheduler.splitwise_role,
            "--protocol": self.deploy.scheduler.protocol,
            "--storage-backend": cache.kvcache_storage_backend,
            "--profile": self.profile,
            "--cycles": self.cycles,
            "the create-or-attach rule": f"{self.rule}: {RULE_VERSIONS[self.rule].text}",
            "the cache layout's bytes per block": self.layout(0).bytes_per_block,
        }

    def local_device(self, rank: int) -> int:
        """The local device ``rank``'s tensors live on."""
        return 0 if self.shares_device else rank

    def device_id(self, rank: int) -> int:
        """The physical device id that names ``rank``'s tensors."""
        return self.device_ids[rank] if self.device_ids else self.local_device(rank)

    def layout(self, rank: int) -> CacheLayout:
        """The cache tensors of ``rank`` on its device."""
        parallel = replace(self.deploy.parallel, local_rank=rank)
        return build_layout(
            self.deploy.model,
            self.deploy.cache,
            parallel,
            device_id=self.device_id(rank),
            local_device=self.local_device(rank),
        )

    def cache_request(self, rank: int, plan: Plan, instance: str, **fields: Any) -> CacheRequest:
        """``rank``'s cache request in this run: its layout, ``plan``'s blocks, the run's rule inputs, pin, protocol
        and timeout, under the engine ``instance``; ``fields`` the rest (``profile``, ``creator_pid``,
        ``host_cache``)."""
        return CacheRequest(
            layout=self.layout(rank),
            num_blocks=plan.num_blocks,
            num_cpu_blocks=plan.num_cpu_blocks,
            storage_backend=self.deploy.cache.kvcache_storage_backend,
            splitwise_role=self.deploy.scheduler.splitwise_role,
            rule=self.rule,
            protocol=self.deploy.scheduler.protocol,
            instance=instance,
            timeout=self.timeout,
            **fields,
        )


def rule_in_force(deploy: DeployConfig, profile: bool, bytes_per_block: int) -> str:
    """The create-or-attach rule's version ``deploy`` follows (``profile``: a profiling run; ``bytes_per_block``:
    its layout's, which sizes the host swap space): the pinned one, else what its protocol makes of none on these
    inputs (beside FastDeploy, where the versions disagree, a ConfigError naming ``--rule``)."""
    cache, scheduler = deploy.cache, deploy.scheduler
    inputs = DecisionInputs(
        profile, host_swap_blocks(cache, bytes_per_block), cache.kvcache_storage_backend, scheduler.splitwise_role
    )
    return protocol_named(scheduler.protocol).rule_in_force(cache.rule, inputs, "--rule")


def run_device_ids(identity: PlatformIdentity, ranks: int) -> tuple[int, ...]:
    """Each of ``ranks`` local ranks' physical device id, from the platform's visible-devices variable
    (a ConfigError naming it where it is bad, before any process starts); none where every rank shares
    one device (cpu)."""
    if shares_one_device(identity.device_type):
        return ()
    return tuple(physical_device_id(identity, rank) for rank in range(ranks))
