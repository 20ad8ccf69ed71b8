"""Two nodes of this machine against one, side by side in one run (issue 25).

The nodes are network namespaces on a bridge (deploy/nodes/local-nodes.sh; started here when they are
not up, and removed again), so traffic between them crosses veth pairs and a bridge. Both sides run on
the same 2 cores: the figures show the cost of the network path, not a speed-up.

  two_node_scaling             steps/s of a DDP run on 2 nodes x 1 process over the same run on 1 node x
                               2 processes (the local launcher, gloo), between the progress events after
                               WARMUP steps; median of --repeats pairs run back to back
  allreduce_busbw_ratio_SIZE   gloo all-reduce bus bandwidth of SIZE between the two nodes over the same
                               between two processes of one node (loopback); busbw = algbw x 2(n-1)/n;
                               medians of --repeats probes, alternated

    python benchmarks/multinode.py               # as root; about 3 minutes on 2 loaded cores
    python benchmarks/multinode.py --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCRIPT = ROOT / "deploy" / "nodes" / "local-nodes.sh"
WARMUP = 50
SIZES = (64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20)
NODE_PORT = 29555  # a fresh namespace has every port free


def allreduce_rank(rank: int, master: str, out: Path, iters: int) -> None:
    """One rank of the all-reduce probe: the median time of each size, written by rank 0."""
    import torch.distributed as dist

    from training_platform.telemetry.bench import allreduce_seconds

    dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=2)
    # Small messages are latency: more samples.
    seconds = {size: allreduce_seconds(size, max(iters, min(200, 2**26 // size))) for size in SIZES}
    if rank == 0:
        out.write_text(json.dumps(seconds))
    dist.destroy_process_group()


def busbw(nodes: list | None, iters: int) -> dict[int, float]:
    """Bytes/s of each size: ranks in the two nodes' namespaces, or both on loopback (nodes None)."""
    from training_platform.telemetry.bench import _free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "seconds.json"
        master = f"{nodes[0].address}:{NODE_PORT}" if nodes else f"127.0.0.1:{_free_port()}"
        procs = []
        for rank in (0, 1):
            prefix = ["ip", "netns", "exec", nodes[rank].namespace] if nodes else []
            env = {**os.environ, "GLOO_SOCKET_IFNAME": "tp0" if nodes else "lo", "OMP_NUM_THREADS": "1"}
            argv = [sys.executable, __file__, "--allreduce-rank", str(rank), "--master", master, "--out", str(out)]
            procs.append(subprocess.Popen([*prefix, *argv, "--iters", str(iters)], env=env))
        codes = [proc.wait(timeout=600) for proc in procs]
        if any(codes):
            raise SystemExit(f"the all-reduce probe failed: exit codes {codes}")
        seconds = {int(size): s for size, s in json.loads(out.read_text()).items()}
    return {size: size / s * 2 * (2 - 1) / 2 for size, s in seconds.items()}


def steps_per_second(home: Path, run_id: str, resources: dict, launcher, snapshot_id: str, steps: int) -> float:
    from tests.fixtures.worker import train
    from training_platform.runs.events import RunEvents
    from training_platform.spec import parse_spec

    spec = parse_spec(
        {
            "name": "bench-nodes",
            "team": "bench",
            "owner": "bench",
            "dataset": {"snapshot_id": snapshot_id},
            "training": {"max_steps": steps, "batch_size": 32, "eval_every": 10 * steps, "log_every": 10},
            "checkpoint": {"every_steps": 10 * steps, "store_uri": str(home / "checkpoints")},
            "resources": resources,
        }
    )
    train(home, run_id, spec, launcher)
    progress = [e for e in RunEvents(home / "runs" / run_id).read() if e["kind"] == "progress" and e["step"] >= WARMUP]
    first, last = progress[0], progress[-1]
    return (last["step"] - first["step"]) / (last["at"] - first["at"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--allreduce-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.allreduce_rank is not None:
        allreduce_rank(args.allreduce_rank, args.master, args.out, args.iters)
        return
    if os.geteuid() != 0:
        raise SystemExit("multinode.py makes network namespaces: run it as root")

    from training_platform.datasets import build_snapshot
    from training_platform.launch.local import LocalLauncher, local_nodes

    already = "tp-node0" in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    up = subprocess.run([str(SCRIPT), "up", "2"], capture_output=True, text=True, check=True)
    nodes = local_nodes(up.stdout.strip().removeprefix("export TP_LOCAL_NODES="))[:2]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            os.environ["TP_HOME"] = str(home)
            snapshot_id = build_snapshot("sklearn_digits", home / "snapshots").snapshot_id
            launcher = LocalLauncher(visible_gpus=0, nodes=nodes)
            pairs = []
            for repeat in range(args.repeats):
                one = steps_per_second(home, f"one-{repeat}", {"nodes": 1, "procs_per_node": 2}, launcher,
                                       snapshot_id, args.steps)
                two = steps_per_second(home, f"two-{repeat}", {"nodes": 2, "procs_per_node": 1}, launcher,
                                       snapshot_id, args.steps)
                pairs.append((one, two))
        # Alternated like the runs: the machine's speed drifts.
        probes = [(busbw(nodes, args.iters), busbw(None, args.iters)) for _ in range(args.repeats)]
        across = {size: statistics.median(a[size] for a, _ in probes) for size in SIZES}
        within = {size: statistics.median(w[size] for _, w in probes) for size in SIZES}
    finally:
        if not already:
            subprocess.run([str(SCRIPT), "down"], capture_output=True, check=True)
    print(f"two_node_scaling: {statistics.median(two / one for one, two in pairs):.3f}")
    for size in SIZES:
        print(f"allreduce_busbw_ratio_{size // 2**10}KiB: {across[size] / within[size]:.3f}")
    print(f"detail_steps_per_second (1 node x 2, 2 nodes x 1): {[(round(a, 1), round(b, 1)) for a, b in pairs]}")
    for size in SIZES:
        print(f"detail_busbw_{size // 2**10}KiB_GBps: across {across[size] / 1e9:.3f}, within {within[size] / 1e9:.3f}")


if __name__ == "__main__":
    main()
