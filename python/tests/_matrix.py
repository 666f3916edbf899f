"""The operation x dtype matrix, run inside every rank of a job (see test_collectives.py).

Every rank can compute every other rank's input, so each checks its own results against a
numpy reference. Integers must match bit for bit, floats within their precision.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

import hcomm

DTYPES: list[Any] = [
    np.bool_,
    np.int8,
    np.uint8,
    np.int16,
    np.uint16,
    np.int32,
    np.uint32,
    np.int64,
    np.uint64,
    np.float16,
    ml_dtypes.bfloat16,
    np.float32,
    np.float64,
]
Arr = npt.NDArray[Any]
N = 5  # elements per rank (per block)


def name(dt: Any) -> str:
    return str(np.dtype(dt).name) if np.dtype(dt).name != "bool" else "bool"


def is_float(dt: Any) -> bool:
    return name(dt) in ("float16", "bfloat16", "float32", "float64")


def data(rank: int, n: int, dt: Any, salt: int = 0) -> Arr:
    k = np.arange(n, dtype=np.int64) * 7 + rank * 3 + salt * 11
    if name(dt) == "bool":
        return (k % 2).astype(np.bool_)
    if is_float(dt):
        return ((k % 5) - 2).astype(np.float64).astype(dt)
    if np.dtype(dt).kind == "u":
        return (k % 7).astype(dt)
    return ((k % 7) - 3).astype(dt)


def ops_for(dt: Any) -> list[str]:
    if name(dt) == "bool":
        # sum and max are logical or, prod and min logical and (numpy's add and multiply).
        return ["sum", "prod", "max", "min", "band", "bor", "bxor"]
    base = ["sum", "prod", "max", "min", "avg"]
    return base if is_float(dt) else [*base, "band", "bor", "bxor"]


def reference(stack: Arr, op: str, dt: Any) -> Arr:
    n = stack.shape[0]
    if is_float(dt):
        f = stack.astype(np.float64)
        r = {
            "sum": lambda: f.sum(0),
            "prod": lambda: f.prod(0),
            "max": lambda: f.max(0),
            "min": lambda: f.min(0),
            "avg": lambda: f.sum(0) / n,
        }[op]()
        return np.asarray(r).astype(dt)
    with np.errstate(over="ignore"):
        if op == "avg":
            s = np.add.reduce(stack, axis=0, dtype=dt).astype(np.int64)
            return (np.sign(s) * (np.abs(s) // n)).astype(dt)
        fn: dict[str, Callable[[], Arr]] = {
            "sum": lambda: np.add.reduce(stack, axis=0, dtype=dt),
            "prod": lambda: np.multiply.reduce(stack, axis=0, dtype=dt),
            "max": lambda: stack.max(0),
            "min": lambda: stack.min(0),
            "band": lambda: np.bitwise_and.reduce(stack, axis=0),
            "bor": lambda: np.bitwise_or.reduce(stack, axis=0),
            "bxor": lambda: np.bitwise_xor.reduce(stack, axis=0),
        }
        return np.asarray(fn[op]()).astype(dt)


class Checker:
    def __init__(self, comm: hcomm.Communicator) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.failures: list[str] = []
        self.checks = 0

    def same(self, what: str, got: Arr, want: Arr, dt: Any) -> None:
        self.checks += 1
        g = np.asarray(got).reshape(-1)
        w = np.asarray(want).reshape(-1)
        if g.shape != w.shape:
            self.failures.append(f"{what}: shape {g.shape} != {w.shape}")
            return
        if is_float(dt):
            tol = {"float16": 2e-3, "bfloat16": 1e-2}.get(name(dt), 1e-6)
            ok = np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
        else:
            ok = bool(np.array_equal(g.view(np.uint8), w.view(np.uint8)))
        if not ok:
            self.failures.append(f"{what}: got {g.tolist()} want {w.tolist()}")

    def inputs(self, n: int, dt: Any, salt: int = 0) -> list[Arr]:
        return [data(r, n, dt, salt) for r in range(self.size)]

    def reductions(self, dt: Any) -> None:
        c, me, p = self.comm, self.rank, self.size
        root = p - 1
        for op in ops_for(dt):
            tag = f"{name(dt)}/{op}"
            xs = self.inputs(N, dt)
            want = reference(np.stack(xs), op, dt)
            out = np.empty(N, dt)
            c.allreduce(xs[me], out, op=op)
            self.same(f"allreduce {tag}", out, want, dt)
            buf = xs[me].copy()
            c.allreduce(buf, op=getattr(hcomm, op.upper()))
            self.same(f"allreduce in place {tag}", buf, want, dt)
            buf = xs[me].copy()
            c.iallreduce(buf, op=op).wait()
            self.same(f"iallreduce {tag}", buf, want, dt)
            out = np.zeros(N, dt)
            c.reduce(xs[me], out if me == root else None, op=op, root=root)
            if me == root:
                self.same(f"reduce {tag}", out, want, dt)
            buf = xs[me].copy()
            c.ireduce(buf, None, op=op, root=root).wait()
            if me == root:
                self.same(f"ireduce in place {tag}", buf, want, dt)
            big = self.inputs(N * p, dt, salt=1)
            want_rs = reference(np.stack(big), op, dt)[me * N : (me + 1) * N]
            out = np.empty(N, dt)
            c.reduce_scatter(big[me], out, op=op)
            self.same(f"reduce_scatter {tag}", out, want_rs, dt)
            buf = big[me].copy()
            c.reduce_scatter(buf, op=op)
            self.same(f"reduce_scatter in place {tag}", buf[me * N : (me + 1) * N], want_rs, dt)
            out = np.empty(N, dt)
            c.ireduce_scatter(big[me], out, op=op).wait()
            self.same(f"ireduce_scatter {tag}", out, want_rs, dt)

    def refused(self) -> None:
        """Bitwise operations on floats and avg on bool are refused before anything is
        sent (the calls after them still match)."""
        pairs = [(dt, op) for dt in DTYPES if is_float(dt) for op in ("band", "bor", "bxor")]
        pairs.append((np.bool_, "avg"))
        for dt, op in pairs:
            self.checks += 1
            try:
                self.comm.allreduce(data(self.rank, N, dt), op=op)
                self.failures.append(f"allreduce {name(dt)}/{op} was not refused")
            except hcomm.InvalidArgument:
                pass

    def movement(self, dt: Any) -> None:
        c, me, p = self.comm, self.rank, self.size
        t = name(dt)
        root = p - 1
        xs = self.inputs(N, dt)
        # broadcast
        buf = xs[me].copy()
        c.broadcast(buf, root=root)
        self.same(f"broadcast {t}", buf, xs[root], dt)
        buf = xs[me].copy()
        c.ibroadcast(buf, root=0).wait()
        self.same(f"ibroadcast {t}", buf, xs[0], dt)
        # allgather
        cat = np.concatenate(xs)
        out = np.empty(N * p, dt)
        c.allgather(xs[me], out)
        self.same(f"allgather {t}", out, cat, dt)
        buf = np.zeros(N * p, dt)
        buf[me * N : (me + 1) * N] = xs[me]
        c.allgather(buf)
        self.same(f"allgather in place {t}", buf, cat, dt)
        out = np.empty((p, N), dt)
        c.iallgather(xs[me], out).wait()
        self.same(f"iallgather {t}", out, cat, dt)
        # allgatherv: rank r contributes r+1 elements
        counts = [r + 1 for r in range(p)]
        vs = [data(r, counts[r], dt, salt=2) for r in range(p)]
        out = np.empty(sum(counts), dt)
        c.allgatherv(vs[me], out, counts)
        self.same(f"allgatherv {t}", out, np.concatenate(vs), dt)
        displs = [sum(counts[:r]) + r for r in range(p)]  # a gap of one after each block
        out = np.zeros(sum(counts) + p, dt)
        c.iallgatherv(vs[me], out, counts, displs).wait()
        for r in range(p):
            self.same(
                f"iallgatherv {t} block {r}", out[displs[r] : displs[r] + counts[r]], vs[r], dt
            )
        # alltoall: block q of rank r goes to rank q
        blocks = self.inputs(N * p, dt, salt=3)
        want = np.concatenate([blocks[r][me * N : (me + 1) * N] for r in range(p)])
        out = np.empty(N * p, dt)
        c.alltoall(blocks[me], out)
        self.same(f"alltoall {t}", out, want, dt)
        buf = blocks[me].copy()
        c.alltoall(buf)
        self.same(f"alltoall in place {t}", buf, want, dt)
        out = np.empty(N * p, dt)
        c.ialltoall(blocks[me], out).wait()
        self.same(f"ialltoall {t}", out, want, dt)
        # alltoallv: rank r sends (r + q) % 3 elements to rank q
        sc = [[(r + q) % 3 for q in range(p)] for r in range(p)]
        sends = [data(r, sum(sc[r]), dt, salt=4) for r in range(p)]
        sd = [[sum(sc[r][:q]) for q in range(p)] for r in range(p)]
        rc = [sc[q][me] for q in range(p)]
        want = np.concatenate([sends[q][sd[q][me] : sd[q][me] + rc[q]] for q in range(p)]).astype(
            dt
        )
        out = np.empty(sum(rc), dt)
        c.alltoallv(sends[me], sc[me], None, out, rc, None)
        self.same(f"alltoallv {t}", out, want, dt)
        out = np.empty(sum(rc), dt)
        c.ialltoallv(sends[me], sc[me], sd[me], out, rc, None).wait()
        self.same(f"ialltoallv {t}", out, want, dt)
        # gather / scatter at the last rank
        out = np.empty(N * p, dt)
        c.gather(xs[me], out if me == root else None, root=root)
        if me == root:
            self.same(f"gather {t}", out, cat, dt)
        buf = np.zeros(N * p, dt)
        buf[me * N : (me + 1) * N] = xs[me]
        c.igather(buf[me * N : (me + 1) * N] if me != 0 else buf, None, root=0).wait()
        if me == 0:
            self.same(f"igather in place {t}", buf, cat, dt)
        src = np.concatenate(self.inputs(N, dt, salt=5))
        out = np.empty(N, dt)
        c.scatter(src if me == root else None, out, root=root)
        self.same(f"scatter {t}", out, src[me * N : (me + 1) * N], dt)
        buf = src.copy() if me == 0 else np.empty(N, dt)
        c.iscatter(buf if me == 0 else None, None if me == 0 else buf, root=0).wait()
        mine = buf[:N] if me == 0 else buf
        self.same(f"iscatter {t}", mine, src[me * N : (me + 1) * N], dt)

    def batch(self) -> None:
        c, me = self.comm, self.rank
        a = data(me, 7, np.float32)
        b = data(me, 3, np.int64)
        d = data(me, 4, np.float32, salt=1)
        e = data(me, 2, np.uint8)
        with c.batch() as bt:
            bt.allreduce(a)
            bt.allreduce(b, op=hcomm.MAX)
            bt.allreduce(d)
            bt.broadcast(e, root=self.size - 1)
        self.same(
            "batch a",
            a,
            reference(np.stack(self.inputs(7, np.float32)), "sum", np.float32),
            np.float32,
        )
        self.same(
            "batch b", b, reference(np.stack(self.inputs(3, np.int64)), "max", np.int64), np.int64
        )
        self.same(
            "batch d",
            d,
            reference(np.stack(self.inputs(4, np.float32, 1)), "sum", np.float32),
            np.float32,
        )
        self.same("batch e", e, data(self.size - 1, 2, np.uint8), np.uint8)

    def run(self) -> None:
        for dt in DTYPES:
            self.reductions(dt)
            self.movement(dt)
        self.batch()
        self.refused()
        self.comm.barrier()
        self.comm.ibarrier().wait()
        if self.failures:
            raise AssertionError(
                f"rank {self.rank}: {len(self.failures)} of {self.checks} checks failed:\n"
                + "\n".join(self.failures[:40])
            )
        print(f"CHECKS {self.checks}")
