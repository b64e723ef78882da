"""A FastDeploy-style worker under Paddle's own launcher: each rank plans on its own device memory,
then every rank agrees on the fewest blocks over the group the launcher made (``Cluster.current``:
no port, store or environment variable of ours), and local rank 0 hands the count to its engine.

``python examples/launched_worker.py`` runs ``python -m paddle.distributed.launch --nproc_per_node 2``
on this machine with 96 and 64 MiB and prints each rank's line; under a launcher of yours, run it as
the launcher's script with ``--memory-mib`` (one value per global rank, comma- or space-separated).
``ENGINE_SUFFIX``, where set, is the suffix of the engine's ``get_profile_block_num``. Both are checked
before anything starts: a bad one is one line naming it, with exit code 2. A failure of fd-platforms
later (e.g. the engine's signal missing) is one line too, with its exit code, as ``fd-platforms`` says
it. Runs from any folder.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import fd_platforms
from fd_platforms.engine import (
    CacheConfig,
    Cluster,
    ConfigError,
    DeviceMemory,
    FdPlatformsError,
    ParallelConfig,
    Plan,
    build_layout,
    load_model_config,
)
from fd_platforms.fastdeploy import check_suffix, hand_off_block_count

MODEL = Path(__file__).resolve().parent / "qwen3-30b-a3b"
CACHE = CacheConfig(rule="2026-04")  # the FastDeploy beside it: from PR #7471 on (its IPC cannot say which)
TIMEOUT = 60.0  # bounds every wait of the agreement
MAX_MIB = 1 << 24  # 16 TiB of device memory: more is a typo
LOCAL_RANKS = 2  # the ranks this example starts on this machine when run without a launcher


def plan_this_rank(memory_mib: int, tp: int = 2) -> tuple[Plan, dict[str, object]]:
    """This rank's own plan on ``memory_mib`` of device memory, and the facts every node must share."""
    platform = fd_platforms.current_platform()
    layout = build_layout(load_model_config(MODEL), CACHE, ParallelConfig(tensor_parallel_size=2, local_rank=0))
    memory = DeviceMemory(memory_mib << 20, None, None, "this example's --memory-mib")
    plan = platform.max_num_blocks(layout=layout, cache=CACHE, memory=memory)
    facts = {"model": MODEL.name, "tp": tp, "bytes_per_block": layout.bytes_per_block, "rule": CACHE.rule}
    return plan, facts


def worker(memory_mib: list[int]) -> None:
    import paddle.distributed as dist
    from paddle.distributed import fleet

    fleet.init(is_collective=True)  # as FastDeploy's worker does; Cluster.current also works before it
    plan, facts = plan_this_rank(memory_mib[dist.get_rank()])
    cluster = Cluster.current(facts=facts, timeout=TIMEOUT)
    agreement = cluster.agree(plan)  # every rank of every node: the fewest blocks
    _, local = cluster.nodes.locate(cluster.global_rank)
    if local == 0 and os.environ.get("ENGINE_SUFFIX"):  # the node's FastDeploy engine waits on this word
        hand_off_block_count(os.environ["ENGINE_SUFFIX"], agreement.plan.num_blocks)
    bound = agreement.bound_by
    print(
        f"rank {cluster.global_rank}: planned {plan.num_blocks} blocks, uses {agreement.plan.num_blocks} "
        f"(node {bound.node} rank {bound.local_rank}'s plan)",
        flush=True,
    )


def mebibytes(raw: str) -> int:
    """One rank's ``--memory-mib`` value: a whole number of MiB from 1 to :data:`MAX_MIB`."""
    if not re.fullmatch(r"[0-9]{1,9}", raw) or not 1 <= int(raw) <= MAX_MIB:
        raise argparse.ArgumentTypeError(
            f"{raw!r} is not valid; allowed: a whole number of MiB from 1 to {MAX_MIB}, one per global rank. "
            "Fix: e.g. --memory-mib 96,64"
        )
    return int(raw)


def parse_args(argv: list[str], environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """``--memory-mib`` (one value per global rank: the launcher's ``PADDLE_TRAINERS_NUM``, or the
    :data:`LOCAL_RANKS` this example launches) and ``ENGINE_SUFFIX``, checked before anything is planned;
    argparse's exit 2 with one line otherwise."""
    parser = argparse.ArgumentParser(prog="launched_worker.py", description=__doc__.split("\n\n")[0])
    parser._negative_number_matcher = re.compile(r"-\.?\d")  # "-5,64" is a value (refused below), not a flag
    parser.add_argument(
        "--memory-mib",
        nargs="+",
        default=["96,64"],
        metavar="MIB[,MIB...]",
        help="device memory of each global rank, in MiB (default 96,64)",
    )
    args = parser.parse_args(argv)
    values = [part for value in args.memory_mib for part in value.split(",")]
    try:
        args.memory_mib = [mebibytes(value) for value in values]
    except argparse.ArgumentTypeError as exc:
        parser.error(f"--memory-mib: {exc}")
    launched = "PADDLE_TRAINER_ID" in environ
    ranks = environ.get("PADDLE_TRAINERS_NUM", "") if launched else str(LOCAL_RANKS)
    if ranks.isdigit() and len(args.memory_mib) != int(ranks):
        who = "the launcher started" if launched else "this example launches"
        parser.error(
            f"--memory-mib has {len(args.memory_mib)} value(s) but {who} {ranks} rank(s). "
            "Fix: give one value per global rank"
        )
    if environ.get("ENGINE_SUFFIX"):
        try:
            check_suffix(environ["ENGINE_SUFFIX"], "ENGINE_SUFFIX")
        except ConfigError as exc:
            parser.error(str(exc))
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if "PADDLE_TRAINER_ID" in os.environ:  # started by the launcher
        try:
            worker(args.memory_mib)
        except FdPlatformsError as error:  # one line and its exit code, as fd-platforms' CLI reports it
            print(f"launched_worker.py: error: {error}", file=sys.stderr, flush=True)
            return error.exit_code
        return 0
    memory = ",".join(map(str, args.memory_mib))
    with tempfile.TemporaryDirectory() as logs:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "paddle.distributed.launch",
                "--nproc_per_node",
                str(LOCAL_RANKS),
                "--log_dir",
                logs,
                __file__,
                "--memory-mib",
                memory,
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT + 60,
            check=False,
        )
        for rank in range(LOCAL_RANKS):  # each rank's line (or error) from its log, among Paddle's own
            for line in (Path(logs) / f"workerlog.{rank}").read_text().splitlines():
                if line.startswith(f"rank {rank}: "):
                    print(line)
                elif line.startswith("launched_worker.py: error: "):
                    print(f"rank {rank}: {line}", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
