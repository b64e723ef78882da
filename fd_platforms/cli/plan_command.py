"""``fd-platforms plan``: KV cache blocks for a model on a platform, and whether the worker creates them.

Values come from ``--config deploy.toml`` with flags winning over the file. With
``--device-memory`` the plan uses that size (nothing live is asked); without it the platform's live
facts of device 0 are used, which may import paddle on accelerator platforms.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..contract.errors import ConfigError, PaddleNotInstalledError, PlatformUnavailableError, UnknownPlatformError
from ..contract.types import DeviceMemory
from ..fastdeploy import FASTDEPLOY  # noqa: F401 - registers protocol "fastdeploy", which [scheduler] protocol may name
from ..lifecycle.engine import run_refusal
from ..lifecycle.spec import rule_in_force
from ..loading.platform import Platform
from ..loading.selection import ENV_PLATFORM, FALLBACK_PLATFORM, Prober, select_platform
from ..rules.config.deploy import DeployConfig
from ..rules.decision import RULE_VERSIONS, DecisionInputs, decided_by
from ..rules.layout import build_layout
from ..rules.planner import memory_per_rank
from ..rules.sizes import decimal_note, format_size
from .deploy_args import add_deploy_arguments, deploy_config, memory_sizes
from .output import emit
from .table import format_table


def refused_because(refusal: Exception) -> str:
    """A few words for the RUN column: why run refuses."""
    return "no Paddle here" if isinstance(refusal, PaddleNotInstalledError) else "cannot share here"


def add_parser(commands: Any) -> argparse.ArgumentParser:
    parser = commands.add_parser("plan", help="plan KV cache blocks for a model on a platform")
    add_deploy_arguments(parser)
    parser.add_argument("--platform", metavar="NAME|all", help="platform to plan for (default: the selected one)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    deploy = deploy_config(args)
    if args.platform == "all" and args.device_memory is None:
        raise ConfigError(
            "--device-memory",
            None,
            "a SIZE with --platform all",
            "pass e.g. --device-memory 80GiB to compare platforms",
        )
    device_memory, non_cache, host_memory = memory_sizes(args)
    notes = tuple(
        note
        for text, size in ((args.device_memory, device_memory), (args.non_cache_memory, non_cache))
        if size is not None and (note := decimal_note(text, size))
    )
    platforms, on_purpose = _platforms(args.platform)
    rows = [
        _plan_row(platform, deploy, device_memory, non_cache, host_memory, notes + on_purpose) for platform in platforms
    ]
    if args.json:
        emit(json.dumps(rows if args.platform == "all" else rows[0], indent=2))
    elif args.platform == "all":
        emit(_side_by_side(rows))
    else:
        emit(_details(rows[0]))
    return 0


def _platforms(choice: str | None) -> tuple[list[Platform], tuple[str, ...]]:
    """The selected platform, one named platform, or every installed one that loads; and a note for
    each accelerator present here when the selection chose the host on purpose (``FD_PLATFORM=cpu``)."""
    if choice is None:
        selection = select_platform()
        on_purpose = f"{ENV_PLATFORM}={FALLBACK_PLATFORM} plans for the host's memory on purpose"
        notes = tuple(f"{found.describe()}; {on_purpose}" for found in selection.present)
        return [selection.platform], notes
    prober = Prober()
    names = list(prober.found) if choice == "all" else [choice]
    if choice != "all" and choice not in prober.found:
        raise UnknownPlatformError("--platform", choice, prober.found, "pick one of those", also="all")
    platforms = []
    for name in names:
        probe = prober.probe(name)
        if probe.platform is None:
            if choice != "all" and probe.error is not None:
                raise probe.error
            continue  # a broken plugin has no facts to plan with; `fd-platforms list` shows why
        platforms.append(probe.platform)
    return platforms, ()


def _plan_row(
    platform: Platform,
    deploy: DeployConfig,
    device_memory: int | None,
    non_cache: int | None,
    host_memory: int | None,
    notes: tuple[str, ...] = (),
) -> dict[str, Any]:
    cache, parallel = deploy.cache, deploy.parallel
    layout = build_layout(deploy.model, cache, parallel)
    rule = rule_in_force(deploy, False, layout.bytes_per_block)  # before any hook
    if device_memory is None:
        detection = platform.detect()
        if not detection.available:
            raise PlatformUnavailableError(
                f"platform {platform.name} has no live memory facts here: {detection.reason}. "
                "Fix: pass --device-memory SIZE to plan without the device"
            )
        memory = memory_per_rank(
            platform.device_memory(0), platform.identity.device_type, parallel.tensor_parallel_size
        )
    else:
        memory = DeviceMemory(device_memory, None, None, "--device-memory")
    plan = platform.max_num_blocks(
        layout=layout, cache=cache, memory=memory, non_cache_bytes=non_cache, host_memory=host_memory
    )
    inputs = DecisionInputs(
        False, plan.num_cpu_blocks, cache.kvcache_storage_backend, deploy.scheduler.splitwise_role, rule
    )
    decision = platform.should_create_cache_tensor(**inputs.kwargs())
    refusal = run_refusal(platform, inputs, decision)  # what run refuses before starting a process
    shaped = platform.cache_layout(layout, max(1, plan.num_blocks))
    if non_cache is not None:
        assumed, non_cache_source = non_cache, "--non-cache-memory"
    elif memory.process_bytes:
        assumed, non_cache_source = memory.process_bytes, f"what this process holds on the device ({memory.source})"
    else:
        no_weights = "none given: weights and activations are not counted; pass --non-cache-memory SIZE"
        assumed, non_cache_source = 0, no_weights
    return {
        "platform": platform.name,
        "model": deploy.model.name,
        "attention": deploy.model.attention,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "block_size": cache.block_size,
        "cache_dtype": shaped.allocated_roles[0].dtype,
        "configured_cache_dtype": cache.cache_dtype,
        "kv_cache_quant_type": cache.kv_cache_quant_type,
        "tensor_dtypes": {role.role: role.dtype for role in shaped.allocated_roles},
        "layer_tensors": [
            {"role": role.role, "shape": [plan.num_blocks, *role.block_shape], "dtype": role.dtype}
            for role in shaped.allocated_roles
        ],
        "num_layers": layout.num_layers,
        "mtp_layers": layout.mtp_layers,
        "num_gpu_block_expand_ratio": layout.mtp_block_ratio,
        "mtp_num_blocks": layout.reported_mtp_blocks(plan.num_blocks),
        "device_cache_bytes": layout.device_bytes(plan.num_blocks),
        "num_blocks": plan.num_blocks,
        "memory_blocks": plan.memory_blocks,
        "bytes_per_block": plan.bytes_per_block,
        "budget_bytes": plan.budget_bytes,
        "tokens": plan.tokens,
        "binding": plan.binding,
        "binding_reason": plan.binding_reason,
        "num_cpu_blocks": plan.num_cpu_blocks,
        "rule": rule,
        "rule_text": RULE_VERSIONS[rule].text,
        "create_cache_tensor": decision.create,
        "decision_term": decision.deciding_term,
        "decided_by": decided_by(decision),
        "decision_reason": decision.reason,
        "runs": refusal is None,
        "run_refusal": None if refusal is None else str(refusal),
        "run_refused_because": None if refusal is None else refused_because(refusal),
        "device_memory": {
            "total_bytes": memory.total_bytes,
            "free_bytes": memory.free_bytes,
            "non_cache_bytes": assumed,
            "non_cache_source": non_cache_source,
            "source": memory.source,
        },
        "limits": [
            {"kind": limit.kind, "value": limit.value, "reason": limit.reason} for limit in platform.declared_limits()
        ],
        "notes": list(notes),
    }


def _dtype_text(row: dict[str, Any]) -> str:
    """The cache's element type as allocated, and what was configured where that differs."""
    dtypes = sorted(set(row["tensor_dtypes"].values()))
    if row["attention"] == "dsa":
        return f"{'/'.join(dtypes)} (DSA packs key and indexer as uint8; cache_dtype does not apply)"
    if row["kv_cache_quant_type"] == "int4_zp" and row["attention"] == "mla":
        return f"{'/'.join(dtypes)} (int4_zp on MLA: the full latent, a byte a value, as FastDeploy allocates it)"
    if row["kv_cache_quant_type"] == "int4_zp":
        return f"{'/'.join(dtypes)} (int4_zp: two 4-bit values a byte, half head_dim; cache_dtype does not apply)"
    if row["cache_dtype"] != row["configured_cache_dtype"]:
        return f"{row['configured_cache_dtype']} (allocated as {'/'.join(dtypes)}, as FastDeploy does)"
    return "/".join(dtypes)


def _details(row: dict[str, Any]) -> str:
    memory = row["device_memory"]
    limits = "; ".join(f"{lim['kind']}={lim['value']} ({lim['reason']})" for lim in row["limits"]) or "none declared"
    blocks = f"{row['num_blocks']} ({row['tokens']} tokens)"
    if row["num_blocks"] != row["memory_blocks"]:
        blocks += f"; memory alone would allow {row['memory_blocks']}"
    if row["mtp_layers"]:
        blocks += (
            f"; the {row['mtp_layers']} MTP layer(s) hold {row['mtp_num_blocks']} "
            f"(int(num_blocks x {row['num_gpu_block_expand_ratio']:g}))"
        )
    outcome = "yes" if row["create_cache_tensor"] else "no, the worker attaches to the cache manager's"
    lines = [
        ("platform", row["platform"]),
        ("model", f"{row['model']} ({row['attention']}, {row['num_layers']} cache layers)"),
        ("parallel", f"tp={row['tensor_parallel_size']}, block_size={row['block_size']}"),
        ("cache dtype", _dtype_text(row)),
        # one layer's cache tensors as the platform allocates them: ``key [N, 64, 8, 128] bfloat16; ...``
        ("tensors per layer", "; ".join(f"{t['role']} {t['shape']} {t['dtype']}" for t in row["layer_tensors"])),
        ("device memory", f"{format_size(memory['total_bytes'])} ({memory['total_bytes']} B) from {memory['source']}"),
        *(("note", note) for note in row["notes"]),
        ("non-cache memory", f"{format_size(memory['non_cache_bytes'])}: {memory['non_cache_source']}"),
        ("budget", f"{format_size(row['budget_bytes'])} ({row['budget_bytes']} B)"),
        ("bytes per block", f"{row['bytes_per_block']} ({format_size(row['bytes_per_block'])})"),
        ("device cache", f"{format_size(row['device_cache_bytes'])} ({row['device_cache_bytes']} B)"),
        ("num_blocks", blocks),
        ("binding", f"{row['binding']}: {row['binding_reason']}"),
        ("declared limits", limits),
        ("num_cpu_blocks", row["num_cpu_blocks"]),
        ("create cache", f"{outcome} ({row['decided_by']}: {row['decision_reason']})"),
        ("run", "yes" if row["runs"] else f"refused before any process starts: {row['run_refusal']}"),
        ("rule", f"version {row['rule']}: {row['rule_text']}"),
    ]
    return format_table(("FIELD", "VALUE"), lines)


def _side_by_side(rows: list[dict[str, Any]]) -> str:
    headers = ("PLATFORM", "NUM_BLOCKS", "BYTES/BLOCK", "BUDGET", "TOKENS", "CPU_BLOCKS", "CREATE", "RUN", "BINDING")
    rule = f"\n\nrule version {rows[0]['rule']}: {rows[0]['rule_text']}" if rows else ""
    plans = format_table(
        headers,
        [
            (
                r["platform"],
                r["num_blocks"],
                r["bytes_per_block"],
                format_size(r["budget_bytes"]),
                r["tokens"],
                r["num_cpu_blocks"],
                r["create_cache_tensor"],
                "yes" if r["runs"] else f"no: {r['run_refused_because']}",
                f"{r['binding']}: {r['binding_reason']}",
            )
            for r in rows
        ],
    )
    return plans + rule + _shape_differences(rows)


def _shape_differences(rows: list[dict[str, Any]]) -> str:
    """Where the platforms allocate a layer's tensors differently (axis order, dtype): each one's
    tensors, blocks written N; nothing when they all agree."""
    shapes = {
        r["platform"]: "; ".join(
            f"{t['role']} [N, {', '.join(map(str, t['shape'][1:]))}] {t['dtype']}" for t in r["layer_tensors"]
        )
        for r in rows
    }
    if len(set(shapes.values())) < 2:
        return ""
    headers = ("PLATFORM", "TENSORS PER LAYER (same bytes; the platform's axes and dtypes)")
    return "\n\n" + format_table(headers, list(shapes.items()))
