"""Rank body of bench/python_overhead.sh: the time of an 8-byte all-reduce (2 float32, sum,
out of place) called from Python, in microseconds, measured as hcomm_perf does: the median
of individually timed iterations of the slowest rank (rank 0 prints it). The timer's own
cost (two perf_counter_ns calls, measured here too and printed second) is included."""

from __future__ import annotations

import argparse
import time

import numpy as np

import hcomm


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--warmup", type=int, default=2000)
    args = ap.parse_args()
    comm = hcomm.init()
    x = np.ones(2, np.float32)
    y = np.empty(2, np.float32)
    for _ in range(args.warmup):
        comm.allreduce(x, y)
    times = [0] * args.iters
    clock = time.perf_counter_ns
    for i in range(args.iters):
        t = clock()
        times[i] = clock() - t
    timer = sorted(times)[args.iters // 2] / 1e3
    comm.barrier()
    for i in range(args.iters):
        t = clock()
        comm.allreduce(x, y)
        times[i] = clock() - t
    assert y[0] == comm.size
    med = np.array([sorted(times)[args.iters // 2] / 1e3])
    comm.allreduce(med, op=hcomm.MAX)
    if comm.rank == 0:
        print(f"{med[0]:.2f} {timer:.2f}")
    comm.destroy()


if __name__ == "__main__":
    main()
