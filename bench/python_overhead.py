"""Rank body of bench/python_overhead.sh: the mean time of an 8-byte all-reduce (2 float32,
sum, out of place) called from Python, in microseconds (rank 0 prints it)."""

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
    comm.barrier()
    t = time.perf_counter()
    for _ in range(args.iters):
        comm.allreduce(x, y)
    us = (time.perf_counter() - t) / args.iters * 1e6
    assert y[0] == comm.size
    if comm.rank == 0:
        print(f"{us:.2f}")
    comm.destroy()


if __name__ == "__main__":
    main()
