"""torch.distributed benchmark: the "hcomm" backend against Gloo in the same job.

Run under torchrun, e.g. ``torchrun --nproc-per-node 4 bench/torch_bench.py``. The default
group is hcomm's; a Gloo group of the same ranks is made next to it, and every measurement
alternates between the two. Rank 0 prints one table (and ``--json FILE`` writes it).

Parts (``--parts``): ``allreduce`` (float32 bus bandwidth, 4 KiB to ``--max-bytes``),
``latency`` (8-byte all-reduce), ``ddp`` (DDP step time: an MLP of about 25 M parameters on a
batch of 8, and a small CNN; with what the step is made of: the same step without DDP, and
the gradients' all-reduce alone, in DDP's buckets, through each backend).

Every measurement alternates the backends repetition by repetition (the host is shared and
its load drifts), and reports the median over repetitions of the slowest rank's time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist


def timed(fns: dict[str, Any], reps: int, group: Any) -> dict[str, float]:
    """Median seconds of each `fns[name]()` over `reps` repetitions, the functions alternating
    within each repetition, each run started together by a barrier (of `group`) and counted
    at its slowest rank."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            dist.barrier(group=group)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    out = {}
    for name, ts in times.items():
        t = torch.tensor(ts, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out[name] = statistics.median(t.tolist())
    return out


def allreduce_part(
    groups: dict[str, Any], max_bytes: int, n: int
) -> list[dict[str, Any]]:
    rows = []
    size = 4096
    gloo = groups["gloo"]
    while size <= max_bytes:
        x = torch.ones(size // 4, dtype=torch.float32)
        reps = max(5, min(50, (256 << 20) // size))
        row: dict[str, Any] = {"bytes": size}
        fns = {}
        for name, g in groups.items():
            dist.all_reduce(x, group=g)  # warm-up
            fns[name] = lambda g=g, x=x: dist.all_reduce(x, group=g)
        for name, t in timed(fns, reps, gloo).items():
            row[f"{name}_us"] = t * 1e6
            row[f"{name}_busbw_GBps"] = 2 * (n - 1) / n * size / t / 1e9
        row["ratio"] = row["hcomm_busbw_GBps"] / row["gloo_busbw_GBps"]
        rows.append(row)
        size *= 4
    return rows


def latency_part(groups: dict[str, Any], blocks: int) -> dict[str, Any]:
    """Mean time of a block of back-to-back 8-byte all-reduces; the median over `blocks`
    blocks, alternating between the backends."""
    x = torch.ones(2, dtype=torch.float32)  # 8 bytes
    iters = {"hcomm": 400, "gloo": 100}
    fns = {}
    for name, g in groups.items():
        for _ in range(50):
            dist.all_reduce(x, group=g)

        def block(g: Any = g, k: int = iters[name]) -> None:
            for _ in range(k):
                dist.all_reduce(x, group=g)

        fns[name] = block
    out: dict[str, Any] = {}
    for name, t in timed(fns, blocks, groups["gloo"]).items():
        out[f"{name}_us"] = t / iters[name] * 1e6
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


def _buckets(model: torch.nn.Module) -> list[torch.Tensor]:
    """Flat float32 tensors the sizes of DDP's gradient buckets (the first 1 MiB, then up to
    25 MiB, parameters in reverse order, as DDP fills them)."""
    sizes, cur, cap = [], 0, 1 << 20
    for p in reversed(list(model.parameters())):
        cur += p.numel() * 4
        if cur >= cap:
            sizes.append(cur)
            cur, cap = 0, 25 << 20
    if cur:
        sizes.append(cur)
    return [torch.ones(b // 4) for b in sizes]


def ddp_part(groups: dict[str, Any], steps: int) -> list[dict[str, Any]]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    rows = []
    gloo = groups["gloo"]
    for kind in ("mlp", "cnn"):
        row: dict[str, Any] = {"model": kind}
        if kind == "mlp":
            x, y = torch.randn(8, 2048), torch.randint(0, 16, (8,))
        else:
            x, y = torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,))
        fns = {}
        keep = []
        for name, g in [("compute", None), *groups.items()]:
            torch.manual_seed(0)
            model = _mlp() if kind == "mlp" else _cnn()
            row["params"] = sum(p.numel() for p in model.parameters())
            net = model if name == "compute" else DDP(model, process_group=g)
            opt = torch.optim.SGD(net.parameters(), lr=0.01)

            def step(net: Any = net, opt: Any = opt, x: Any = x, y: Any = y) -> None:
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()

            for _ in range(3):
                step()
            fns[name] = step
            keep.append((net, opt))
            if name != "compute":
                bufs = _buckets(model)

                def comm(g: Any = g, bufs: list[torch.Tensor] = bufs) -> None:
                    works = [dist.all_reduce(b, group=g, async_op=True) for b in bufs]
                    for w in works:
                        w.wait()

                fns[f"{name}_comm"] = comm
        for name, t in timed(fns, steps, gloo).items():
            row[f"{name}_ms"] = t * 1e3
        row["ratio"] = row["hcomm_ms"] / row["gloo_ms"]
        rows.append(row)
        del keep, fns
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--parts", default="allreduce,latency,ddp")
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=15)
    p.add_argument("--json")
    p.add_argument("--label", default="")
    a = p.parse_args()
    dist.init_process_group("hcomm")
    n, rank = dist.get_world_size(), dist.get_rank()
    groups = {"hcomm": None, "gloo": dist.new_group(backend="gloo")}
    parts = a.parts.split(",")
    res: dict[str, Any] = {"ranks": n, "label": a.label, "torch": torch.__version__}
    if "latency" in parts:
        res["latency"] = latency_part(groups, a.blocks)
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
                    f"  | without DDP {r['compute_ms']:.1f} ms; gradients' all-reduce alone: "
                    f"hcomm {r['hcomm_comm_ms']:.1f} ms, gloo {r['gloo_comm_ms']:.1f} ms"
                )
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
