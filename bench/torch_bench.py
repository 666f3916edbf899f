"""torch.distributed benchmark: the "hcomm" backend against Gloo in the same job.

Run under torchrun, e.g. ``torchrun --nproc-per-node 4 bench/torch_bench.py``. The default
group is hcomm's; a Gloo group of the same ranks is made next to it, and every measurement
alternates between the two. Rank 0 prints one table (and ``--json FILE`` writes it).

Parts (``--parts``): ``allreduce`` (float32 bus bandwidth, 4 KiB to ``--max-bytes``),
``latency`` (8-byte all-reduce), ``ddp`` (DDP step time: an MLP of about 25 M parameters on a
batch of 8, and a small CNN).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist


def timed(fn: Any, reps: int, group: Any) -> float:
    """Median seconds of `fn()` over `reps` runs, each run started together by a barrier."""
    times = []
    for _ in range(reps):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    # Every rank reports the slowest rank's time of each run.
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return statistics.median(t.tolist())


def allreduce_part(
    groups: dict[str, Any], max_bytes: int, n: int
) -> list[dict[str, Any]]:
    rows = []
    size = 4096
    while size <= max_bytes:
        x = torch.ones(size // 4, dtype=torch.float32)
        reps = max(3, min(50, (256 << 20) // size))
        row: dict[str, Any] = {"bytes": size}
        for name, g in groups.items():
            dist.all_reduce(x, group=g)  # warm-up
            t = timed(lambda g=g, x=x: dist.all_reduce(x, group=g), reps, g)
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_busbw_GBps"] = 2 * (n - 1) / n * size / t / 1e9
        row["ratio"] = row["hcomm_busbw_GBps"] / row["gloo_busbw_GBps"]
        rows.append(row)
        size *= 4
    return rows


def latency_part(groups: dict[str, Any]) -> dict[str, Any]:
    x = torch.ones(2, dtype=torch.float32)  # 8 bytes
    out: dict[str, Any] = {}
    for name, g in groups.items():
        for _ in range(50):
            dist.all_reduce(x, group=g)
        dist.barrier(group=g)
        iters = 2000 if name == "hcomm" else 500
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x, group=g)
        t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=g)
        out[f"{name}_us"] = float(t) * 1e6
    out["ratio"] = out["hcomm_us"] / out["gloo_us"]
    return out


def _mlp() -> torch.nn.Module:
    # 2048*4096 + 4096*4096 + 4096*16 (+ biases): about 25.2 M parameters
    return torch.nn.Sequential(
        torch.nn.Linear(2048, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 4096),
        torch.nn.ReLU(),
        torch.nn.Linear(4096, 16),
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(4),
        torch.nn.Flatten(),
        torch.nn.Linear(1024, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )


def ddp_part(groups: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows = []
    for kind in ("mlp", "cnn"):
        row: dict[str, Any] = {"model": kind}
        for name, g in groups.items():
            torch.manual_seed(0)
            model = _mlp() if kind == "mlp" else _cnn()
            row["params"] = sum(p.numel() for p in model.parameters())
            ddp = DDP(model, process_group=g)
            opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
            if kind == "mlp":
                x, y = torch.randn(8, 2048), torch.randint(0, 16, (8,))
            else:
                x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))

            def step(ddp: Any = ddp, opt: Any = opt, x: Any = x, y: Any = y) -> None:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
                opt.step()

            for _ in range(3):
                step()
            row[f"{name}_ms"] = timed(step, steps, g) * 1e3
            del ddp, opt, model
        row["ratio"] = row["hcomm_ms"] / row["gloo_ms"]
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="allreduce,latency,ddp")
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--json")
    p.add_argument("--label", default="")
    a = p.parse_args()
    dist.init_process_group("hcomm")
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = {"hcomm": None, "gloo": dist.new_group(backend="gloo")}
    parts = a.parts.split(",")
    res: dict[str, Any] = {"ranks": n, "label": a.label, "torch": torch.__version__}
    if "latency" in parts:
        res["latency"] = latency_part(groups)
    if "allreduce" in parts:
        res["allreduce"] = allreduce_part(groups, a.max_bytes, n)
    if "ddp" in parts:
        res["ddp"] = ddp_part(groups, a.steps)
    if rank == 0:
        print(f"== torch.distributed, {n} ranks {a.label} (torch {torch.__version__})")
        if "latency" in res:
            r = res["latency"]
            print(
                f"8-byte all_reduce: hcomm {r['hcomm_us']:.1f} us  gloo {r['gloo_us']:.1f} us  "
                f"ratio {r['ratio']:.3f}"
            )
        if "allreduce" in res:
            print(f"{'bytes':>10} {'hcomm GB/s':>11} {'gloo GB/s':>10} {'ratio':>7}")
            for r in res["allreduce"]:
                print(
                    f"{r['bytes']:>10} {r['hcomm_busbw_GBps']:>11.3f} "
                    f"{r['gloo_busbw_GBps']:>10.3f} {r['ratio']:>7.2f}"
                )
        if "ddp" in res:
            for r in res["ddp"]:
                print(
                    f"DDP {r['model']} ({r['params'] / 1e6:.1f} M params): hcomm "
                    f"{r['hcomm_ms']:.1f} ms  gloo {r['gloo_ms']:.1f} ms  ratio {r['ratio']:.2f}"
                )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
