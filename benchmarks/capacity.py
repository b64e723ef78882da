"""KV cache capacity: the planner against the legacy ``min(blocks, 40000)`` cap.

For each model in ``examples/`` at tensor_parallel_size 4, block_size 64, bfloat16 cache,
memory_utilization 0.9, and a flat 8 GiB of non-cache memory per rank (a stated stand-in for
weights and activations; real runs measure it), on devices of 32, 64, 80, 96 and 141 GiB:

- ``memory``: ``budget // bytes_per_block``, what memory alone allows;
- ``legacy``: ``min(memory, 40000)``, the hard cap FastDeploy used to apply;
- ``planned``: :func:`fd_platforms.rules.planner.plan_blocks` with one declared limit, 32-bit element
  offsets (``max_tensor_elements = 2**31 - 1``), the named reason the legacy cap stood in for.

Run from the repository root: ``python benchmarks/capacity.py [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
try:
    import fd_platforms  # noqa: F401
except ModuleNotFoundError:
    sys.path.insert(0, str(ROOT))

from fd_platforms.contract.types import DeviceMemory, PlatformLimit  # noqa: E402
from fd_platforms.rules.config import CacheConfig, ParallelConfig, load_model_config  # noqa: E402
from fd_platforms.rules.layout import build_layout  # noqa: E402
from fd_platforms.rules.planner import plan_blocks  # noqa: E402

MODELS = ("qwen3-30b-a3b", "llama-3.1-8b", "deepseek-v3", "deepseek-v3.2")
DEVICE_GIB = (32, 64, 80, 96, 141)
TENSOR_PARALLEL = 4
NON_CACHE_BYTES = 8 * 2**30
LEGACY_CAP = 40000
LIMIT = PlatformLimit("max_tensor_elements", 2**31 - 1, "32-bit element offsets in attention kernels")
COLUMNS = (
    ("model", "model"),
    ("device_gib", "GiB"),
    ("attention", "attn"),
    ("bytes_per_block", "bytes/block"),
    ("memory_blocks", "memory"),
    ("legacy_blocks", "legacy"),
    ("planned_blocks", "planned"),
    ("binding", "binding"),
    ("planned_over_legacy", "planned/legacy"),
    ("planned_over_memory", "planned/memory"),
)

TEXT_COLUMNS = frozenset({"model", "attention", "binding"})


def rows() -> list[dict[str, object]]:
    """One row per model and device size."""
    cache = CacheConfig(block_size=64, cache_dtype="bfloat16", memory_utilization=0.9)
    parallel = ParallelConfig(tensor_parallel_size=TENSOR_PARALLEL)
    table: list[dict[str, object]] = []
    for name in MODELS:
        model = load_model_config(ROOT / "examples" / name)
        layout = build_layout(model, cache, parallel)
        for gib in DEVICE_GIB:
            memory = DeviceMemory(total_bytes=gib * 2**30, free_bytes=None, process_bytes=None, source="benchmark")
            plan = plan_blocks(layout, memory, cache, non_cache_bytes=NON_CACHE_BYTES, limits=[LIMIT])
            legacy = min(plan.memory_blocks, LEGACY_CAP)
            row: dict[str, object] = {
                "model": name,
                "device_gib": gib,
                "attention": model.attention,
                "bytes_per_block": plan.bytes_per_block,
                "memory_blocks": plan.memory_blocks,
                "legacy_blocks": legacy,
                "planned_blocks": plan.num_blocks,
                "binding": plan.binding,
                "planned_over_legacy": round(plan.num_blocks / legacy, 3),
                "planned_over_memory": round(plan.num_blocks / plan.memory_blocks, 3),
            }
            table.append(row)
    return table


def _cell(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def render(table: list[dict[str, object]]) -> str:
    """The rows as an aligned text table."""
    cells = [[title for _, title in COLUMNS]]
    cells += [[_cell(row[key]) for key, _ in COLUMNS] for row in table]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    left = [key in TEXT_COLUMNS for key, _ in COLUMNS]
    lines = [
        "  ".join(
            cell.ljust(width) if text else cell.rjust(width)
            for cell, width, text in zip(line, widths, left, strict=True)
        )
        for line in cells
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    header = (
        f"tp={TENSOR_PARALLEL}, block_size=64, bfloat16, memory_utilization=0.9, "
        f"non-cache {NON_CACHE_BYTES // 2**30} GiB/rank; "
        f"legacy = min(memory, {LEGACY_CAP}); planned = plan_blocks with max_tensor_elements=2**31-1"
    )
    return "\n".join([header, *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print a JSON list of rows instead of a table")
    args = parser.parse_args(argv)
    table = rows()
    print(json.dumps(table, indent=2) if args.json else render(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
