"""Jobs the torch tests launch with torchrun: `python torch_jobs.py SCENARIO`.

Each rank checks what it can and exits non-zero (with the reason on stderr) on the first
difference; rank 0 prints ``OK <scenario>`` at the end.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]
FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
R = dist.ReduceOp


def fail(msg: str) -> None:
    raise AssertionError(f"rank {dist.get_rank()}: {msg}")


def same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.dtype != b.dtype or a.shape != b.shape:
        fail(f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
    if a.dtype in FLOATS:
        ok = torch.allclose(a.double(), b.double(), rtol=1e-2, atol=1e-2, equal_nan=True)
    else:
        ok = torch.equal(a, b)
    if not ok:
        fail(f"{what}: hcomm {a.flatten()[:8].tolist()} vs reference {b.flatten()[:8].tolist()}")


def data(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in FLOATS:
        return (torch.randn(shape, generator=g) * 4).to(dtype)
    lo, hi = (0, 7) if dtype == torch.uint8 else (-5, 6)
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def ops_for(dtype: torch.dtype) -> list[Any]:
    if dtype == torch.bool:
        return [R.MIN, R.MAX, R.BAND, R.BOR]
    if dtype in FLOATS:
        return [R.SUM, R.PRODUCT, R.MIN, R.MAX]
    return [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]


def gloo_ok(fn: Any) -> bool:
    """Runs `fn` (a Gloo call); False when Gloo refuses the type or op."""
    try:
        fn()
    except RuntimeError:
        return False
    return True


def conformance() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    seed = 0
    for dtype in DTYPES:
        for shape in [(), (0,), (5,), (3, 4)]:
            seed += 1
            base = data(dtype, shape, seed * 100 + rank)
            # all_reduce, every op, contiguous; compared with Gloo where Gloo has the op
            for op in ops_for(dtype):
                a, b = base.clone(), base.clone()
                dist.all_reduce(a, op=op)
                try:
                    dist.all_reduce(b, op=op, group=gloo)
                except RuntimeError:
                    # Gloo lacks this op or type: the reference is computed here.
                    allv = [data(dtype, shape, seed * 100 + r) for r in range(n)]
                    b = allv[0].clone()
                    for v in allv[1:]:
                        b = {
                            R.SUM: lambda x, y: x + y,
                            R.PRODUCT: lambda x, y: x * y,
                            R.MIN: torch.minimum,
                            R.MAX: torch.maximum,
                            R.BAND: lambda x, y: x & y,
                            R.BOR: lambda x, y: x | y,
                            R.BXOR: lambda x, y: x ^ y,
                        }[op](b, v)
                same(a, b, f"all_reduce {op} {dtype} {shape}")
            # Collectives that move data: exact references from the other ranks' seeds,
            # and Gloo's result too where Gloo takes the type.
            vals = [data(dtype, shape, seed * 100 + r) for r in range(n)]
            for root in range(n):
                a = base.clone()
                dist.broadcast(a, src=root)
                same(a, vals[root], f"broadcast root {root} {dtype} {shape}")
                b = base.clone()
                if gloo_ok(lambda b=b, root=root: dist.broadcast(b, src=root, group=gloo)):
                    same(a, b, f"broadcast vs gloo {dtype} {shape}")
            a = [torch.empty_like(base) for _ in range(n)]
            dist.all_gather(a, base)
            for i in range(n):
                same(a[i], vals[i], f"all_gather {dtype} {shape}")
            if base.dim() > 0:
                a = torch.empty((n * base.shape[0], *base.shape[1:]), dtype=dtype)
                dist.all_gather_into_tensor(a, base)
                same(a, torch.cat(vals), f"all_gather_into_tensor {dtype} {shape}")
                b = torch.empty_like(a)
                if gloo_ok(lambda b=b, base=base: dist.all_gather_into_tensor(b, base, group=gloo)):
                    same(a, b, f"all_gather_into_tensor vs gloo {dtype} {shape}")
            for root in range(n):
                a = [torch.empty_like(base) for _ in range(n)] if rank == root else None
                dist.gather(base, a, dst=root)
                if a is not None:
                    for i in range(n):
                        same(a[i], vals[i], f"gather {dtype} {shape}")
                src = [data(dtype, shape, 7 + i) for i in range(n)] if rank == root else None
                a = torch.empty_like(base)
                dist.scatter(a, src, src=root)
                same(a, data(dtype, shape, 7 + rank), f"scatter {dtype} {shape}")
            if dtype in FLOATS or dtype in (torch.int32, torch.int64):
                # reduce (Gloo has SUM for these)
                for root in range(n):
                    a = base.clone()
                    dist.reduce(a, dst=root)
                    b = base.clone()
                    dist.reduce(b, dst=root, group=gloo)
                    if rank == root:
                        same(a, b, f"reduce {dtype} {shape}")
    # uneven all_gather
    x = torch.arange(rank + 1, dtype=torch.float32)
    outs = [torch.empty(r + 1) for r in range(n)]
    dist.all_gather(outs, x)
    for r in range(n):
        same(outs[r], torch.arange(r + 1, dtype=torch.float32), "uneven all_gather")
    # AVG and PREMUL_SUM against local references
    x = data(torch.float64, (6,), rank)
    allx = [data(torch.float64, (6,), r) for r in range(n)]
    a = x.clone()
    dist.all_reduce(a, op=R.AVG)
    same(a, sum(allx) / n, "all_reduce AVG")
    a = x.clone()
    dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5))
    same(a, sum(allx) * 0.5, "all_reduce PREMUL_SUM")
    # reduce_scatter (list) and reduce_scatter_tensor
    ins = [data(torch.float32, (4,), rank * 10 + i) for i in range(n)]
    out = torch.empty(4)
    dist.reduce_scatter(out, ins)
    ref = sum(data(torch.float32, (4,), r * 10 + rank) for r in range(n))
    same(out, ref, "reduce_scatter")
    flat = torch.cat(ins)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, flat)
    same(out, ref, "reduce_scatter_tensor")
    # all_to_all, all_to_all_single even and uneven
    ins = [torch.full((r + 1,), float(rank * 100 + r)) for r in range(n)]
    outs = [torch.empty(rank + 1) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for r in range(n):
        same(outs[r], torch.full((rank + 1,), float(r * 100 + rank)), "all_to_all")
    inp = torch.arange(n * 2, dtype=torch.int64) + rank * 1000
    a, b = torch.empty_like(inp), torch.empty_like(inp)
    dist.all_to_all_single(a, inp)
    dist.all_to_all_single(b, inp, group=gloo)
    same(a, b, "all_to_all_single even")
    g = torch.Generator().manual_seed(42)
    for it in range(20):
        splits = torch.randint(0, 4, (n, n), generator=g)  # splits[i][j]: i sends j rows
        isp = splits[rank].tolist()
        osp = splits[:, rank].tolist()
        inp = torch.randn(sum(isp), 3, generator=torch.Generator().manual_seed(it * 10 + rank))
        a = torch.empty(sum(osp), 3)
        b = torch.empty(sum(osp), 3)
        dist.all_to_all_single(a, inp, osp, isp)
        dist.all_to_all_single(b, inp, osp, isp, group=gloo)
        same(a, b, f"all_to_all_single uneven #{it}")
    # non-contiguous tensors (copied in and out)
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6) + rank
    a, b = base.clone().t(), base.clone().t()
    assert not a.is_contiguous()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    same(a, b, "all_reduce non-contiguous")
    a = base.clone()[:, ::2]
    dist.broadcast(a, src=n - 1)
    ref = (torch.arange(24, dtype=torch.float32).reshape(4, 6) + n - 1)[:, ::2]
    same(a, ref, "broadcast non-contiguous")
    # complex through views
    z = torch.complex(torch.randn(5), torch.randn(5)) + rank
    a, b = z.clone(), z.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    same(torch.view_as_real(a), torch.view_as_real(b), "all_reduce complex")
    # coalesced all_reduce
    ts = [torch.full((3,), float(rank)), torch.full((2, 2), float(rank * 2))]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    same(ts[0], torch.full((3,), float(sum(range(n)))), "coalesced all_reduce")
    # point to point: send/recv, isend/irecv, batch_isend_irecv (a ring)
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    if n > 1:
        out = torch.full((5,), float(rank))
        got = torch.empty(5)
        ops = [dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, got, prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        same(got, torch.full((5,), float(prv)), "batch_isend_irecv")
        big = torch.full((1 << 20,), float(rank))
        got = torch.empty(1 << 20)
        s = dist.isend(big, nxt, tag=3)
        r = dist.irecv(got, prv, tag=3)
        s.wait()
        r.wait()
        same(got, torch.full((1 << 20,), float(prv)), "isend/irecv 4 MiB")
        if rank == 0:
            dist.send(torch.tensor([7, 8, 9]), 1)
        elif rank == 1:
            t = torch.empty(3, dtype=torch.int64)
            dist.recv(t, 0)
            same(t, torch.tensor([7, 8, 9]), "send/recv")
        # recv without src (from any source) returns the sender's rank
        if rank == 0:
            senders = []
            for _ in range(n - 1):
                t = torch.empty(2, dtype=torch.int64)
                src = dist.recv(t, tag=11)
                if t.tolist() != [src, 5]:
                    fail(f"recv from any source: got {t.tolist()} from {src}")
                senders.append(src)
            if sorted(senders) != list(range(1, n)):
                fail(f"recv from any source: senders {senders}")
        else:
            dist.send(torch.tensor([rank, 5]), 0, tag=11)
    # object collectives, one larger than 64 MiB
    objs: list[Any] = [None] * n
    dist.all_gather_object(objs, {"rank": rank, "x": list(range(rank))})
    for r in range(n):
        if objs[r] != {"rank": r, "x": list(range(r))}:
            fail(f"all_gather_object: {objs[r]}")
    blob = [bytes([rank % 256]) * (65 << 20)] if rank == 0 else [None]
    dist.broadcast_object_list(blob, src=0)
    if len(blob[0]) != 65 << 20 or blob[0][:1] != b"\0":
        fail("broadcast_object_list of 65 MiB")
    lst = [f"o{i}" for i in range(n)] if rank == 0 else None
    got_obj: list[Any] = [None]
    dist.scatter_object_list(got_obj, lst, src=0)
    if got_obj[0] != f"o{rank}":
        fail(f"scatter_object_list: {got_obj}")
    gathered: list[Any] | None = [None] * n if rank == 0 else None
    dist.gather_object(("r", rank), gathered, dst=0)
    if rank == 0 and gathered != [("r", r) for r in range(n)]:
        fail(f"gather_object: {gathered}")
    dist.barrier()
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    async_checks()
    subgroups()


def async_checks() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    # async_op: wait() and get_future(); the future's value is the output tensors
    t = torch.full((1 << 18,), float(rank))
    w = dist.all_reduce(t, async_op=True)
    fut = w.get_future()
    val = fut.wait()
    if not isinstance(val, list) or val[0] is not t:
        fail(f"future value {type(val)}")
    w.wait()
    same(t, torch.full((1 << 18,), float(sum(range(n)))), "async all_reduce")
    # several in flight, completed in order, chained with then()
    works = []
    ts = [torch.full((1000 * (i + 1),), float(i + rank)) for i in range(6)]
    for x in ts:
        works.append(dist.all_reduce(x, async_op=True))
    chained = works[-1].get_future().then(lambda f: f.value()[0].sum().item())
    for w in works:
        w.wait()
    for i, x in enumerate(ts):
        same(x, torch.full_like(x, float(i * n + sum(range(n)))), f"async #{i}")
    if chained.wait() != float(ts[-1].sum().item()):
        fail("then() on the future")
    # small (inline) and large (worker) mixed keep the call order
    small = torch.tensor([float(rank)])
    large = torch.full((1 << 20,), 1.0)
    w1 = dist.all_reduce(large, async_op=True)
    w2 = dist.all_reduce(small, async_op=True)
    w2.wait()
    w1.wait()
    same(small, torch.tensor([float(sum(range(n)))]), "mixed order small")
    same(large[:4], torch.full((4,), float(n)), "mixed order large")


def subgroups() -> None:
    rank, n = dist.get_rank(), dist.get_world_size()
    if n < 2:
        return
    evens = dist.new_group([r for r in range(n) if r % 2 == 0])
    odds = dist.new_group([r for r in range(n) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    members = [r for r in range(n) if r % 2 == rank % 2]
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    same(t, torch.tensor([float(sum(members))]), "subgroup all_reduce")
    # overlapping groups: {0,1} and {1,...,n-1}
    g01 = dist.new_group([0, 1])
    rest = dist.new_group(list(range(1, n)))
    if rank in (0, 1):
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t, group=g01)
        same(t, torch.tensor([3.0]), "overlapping group {0,1}")
    if rank >= 1 and n > 2:
        t = torch.tensor([float(rank)])
        dist.broadcast(t, src=n - 1, group=rest)
        same(t, torch.tensor([float(n - 1)]), "overlapping group {1..}")
    if n == 4:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        for dim in ("dp", "tp"):
            pg = mesh.get_group(dim)
            ranks = dist.get_process_group_ranks(pg)
            t = torch.tensor([float(rank)])
            dist.all_reduce(t, group=pg)
            same(t, torch.tensor([float(sum(ranks))]), f"DeviceMesh {dim} all_reduce")


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 4),
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 4),
    )


class _Unused(torch.nn.Module):
    """A model with a branch that takes no part in the loss (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 16)
        self.unused = torch.nn.Linear(32, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _batch(kind: str, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn((8, 3, 8, 8) if kind == "cnn" else (8, 32), generator=g)
    y = torch.randint(0, 4, (8,), generator=g)
    return x, y


def _train(kind: str, pg: Any, steps: int, **opts: Any) -> tuple[list[float], list[torch.Tensor]]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = {"mlp": _mlp, "cnn": _cnn, "unused": _Unused}[kind]()
    hook = opts.pop("hook", None)
    no_sync = opts.pop("no_sync", False)
    uneven = opts.pop("uneven", False)
    ddp = DDP(model, process_group=pg, **opts)
    if hook == "bf16":
        ddp.register_comm_hook(pg, default_hooks.bf16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    losses: list[float] = []
    my_steps = steps + (rank * 3 if uneven else 0)
    with Join([ddp], enable=uneven):
        for step in range(my_steps):
            x, y = _batch("cnn" if kind == "cnn" else "mlp", step, rank)
            opt.zero_grad()
            if no_sync and step % 3 != 2:
                with ddp.no_sync():
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                    loss.backward()
                losses.append(float(loss))
                continue
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss))
    return losses, [p.detach().clone() for p in model.parameters()]


def ddp() -> None:
    n = dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    hcomm_pg = dist.distributed_c10d._get_default_group()
    steps = int(os.environ.get("JOB_STEPS", "30"))
    configs: list[tuple[str, dict[str, Any]]] = [
        ("mlp", {}),
        ("cnn", {}),
        ("mlp", {"gradient_as_bucket_view": True}),
        ("unused", {"find_unused_parameters": True}),
        ("mlp", {"static_graph": True}),
        ("mlp", {"no_sync": True}),
        ("mlp", {"uneven": True}),
        ("mlp", {"hook": "bf16"}),
    ]
    for kind, opts in configs:
        lh, ph = _train(kind, hcomm_pg, steps, **dict(opts))
        lg, pgl = _train(kind, gloo, steps, **dict(opts))
        what = f"DDP {kind} {opts}"
        if n == 2:
            if lh != lg:
                fail(f"{what}: losses differ: {lh[:3]} vs gloo {lg[:3]}")
            for a, b in zip(ph, pgl, strict=True):
                if not torch.equal(a, b):
                    fail(f"{what}: parameters differ bitwise")
        else:
            ltol = 2e-2 if opts.get("hook") == "bf16" else 1e-4
            if not torch.allclose(torch.tensor(lh), torch.tensor(lg), rtol=ltol, atol=ltol):
                fail(f"{what}: losses {lh[:3]} vs gloo {lg[:3]}")
            # bf16 sums in another order round differently: bf16's precision then.
            tol = 2e-2 if opts.get("hook") == "bf16" else 1e-5
            for a, b in zip(ph, pgl, strict=True):
                if not torch.allclose(a, b, rtol=tol, atol=tol):
                    fail(f"{what}: parameters beyond tolerance {tol}")


def parallel() -> None:
    """FSDP2 fully_shard on a CPU DeviceMesh against a single-process reference; a 2-stage
    GPipe schedule of torch.distributed.pipelining against the unsplit model; an
    all_to_all_single loop with random splits."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank, n = dist.get_rank(), dist.get_world_size()
    # FSDP2: every rank trains on its batch; the gradients of the sharded model, gathered,
    # equal those of one process on all the batches.
    torch.manual_seed(0)
    ref = _mlp()
    torch.manual_seed(0)
    model = _mlp()
    mesh = init_device_mesh("cpu", (n,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    batches = [_batch("mlp", 0, r) for r in range(n)]
    x, y = batches[rank]
    torch.nn.functional.cross_entropy(model(x), y).backward()
    xs = torch.cat([b[0] for b in batches])
    ys = torch.cat([b[1] for b in batches])
    torch.nn.functional.cross_entropy(ref(xs), ys).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        g = p.grad.full_tensor()
        if not torch.allclose(g, q.grad, rtol=1e-4, atol=1e-6):
            fail(f"FSDP2 gradient of {name} differs from the reference")
    # Pipelining: 2 stages on ranks 0 and 1 (a group of them), 4 micro-batches.
    pp = dist.new_group([0, 1])
    if rank < 2:
        torch.manual_seed(0)
        full = _mlp()
        stages = [full[:2], full[2:]]
        stage = PipelineStage(stages[rank], rank, 2, torch.device("cpu"), group=pp)
        loss_fn = torch.nn.CrossEntropyLoss()
        sched = ScheduleGPipe(stage, n_microbatches=4, loss_fn=loss_fn)
        g = torch.Generator().manual_seed(5)
        x = torch.randn(16, 32, generator=g)
        y = torch.randint(0, 4, (16,), generator=g)
        losses: list[torch.Tensor] = []
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y, losses=losses)
        torch.manual_seed(0)
        ref = _mlp()
        for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True):
            (loss_fn(ref(xm), ym) / 4).backward()
        mine = stages[rank]
        theirs = [ref[:2], ref[2:]][rank]
        for p, q in zip(mine.parameters(), theirs.parameters(), strict=True):
            if not torch.allclose(p.grad, q.grad, rtol=1e-4, atol=1e-6):
                fail("pipelining gradients differ from the unsplit model")
        if rank == 1:
            want = [loss_fn(ref(xm), ym) for xm, ym in zip(x.chunk(4), y.chunk(4), strict=True)]
            for a, b in zip(losses, want, strict=True):
                same(a.detach(), b.detach(), "pipelining loss")
    # all_to_all_single with random splits, many rounds, sizes from 0 to a few KiB per peer
    g = torch.Generator().manual_seed(99)
    for it in range(100):
        splits = torch.randint(0, 700, (n, n), generator=g)
        isp, osp = splits[rank].tolist(), splits[:, rank].tolist()
        inp = torch.arange(sum(isp), dtype=torch.int64) + rank * 10**6 + it * 10**8
        out = torch.empty(sum(osp), dtype=torch.int64)
        dist.all_to_all_single(out, inp, osp, isp)
        pos = 0
        for src in range(n):
            start = sum(splits[src, :rank].tolist())
            want = (
                torch.arange(start, start + osp[src], dtype=torch.int64) + src * 10**6 + it * 10**8
            )
            same(out[pos : pos + osp[src]], want, f"all_to_all_single loop #{it} from {src}")
            pos += osp[src]


def fault_kill() -> None:
    """Rank 1 dies by SIGKILL after one all-reduce; every survivor must raise, naming it."""
    import signal

    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(t)
            time.sleep(0.01)
    except Exception as e:
        took = time.monotonic() - t0
        print(f"RAISED rank {rank} after {took:.1f}s: {e}", flush=True)
        # A failed Work's future fails too (C++ readers such as DDP's reducer see its error).
        fut = dist.all_reduce(t, async_op=True).get_future()
        try:
            fut.wait()
        except Exception as f:
            print(f"FUTURE RAISED {type(f).__name__}: {' '.join(str(f).split())}", flush=True)
        os._exit(0)
    fail("no error after the peer was killed")


def fault_shrink() -> None:
    """The last rank dies by SIGKILL after a few all-reduces; the survivors catch the error,
    shrink the default group without it (dist.shrink_group, revoking first) and go on with
    exact sums on the new group."""
    import signal

    import hcomm.torch

    rank, n = dist.get_rank(), dist.get_world_size()
    for k in range(5):
        t = torch.full((16,), float(rank + k), dtype=torch.float64)
        dist.all_reduce(t)
        same(t, torch.full((16,), float(sum(range(n)) + n * k), dtype=torch.float64), "before")
    if rank == n - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(100000):
            dist.all_reduce(t)
        fail("no error after the peer was killed")
    except Exception as e:
        print(f"RAISED rank {rank}: {type(e).__name__}", flush=True)
    dist.distributed_c10d.shrink_group([n - 1], shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
    m = dist.get_world_size()
    assert m == n - 1, m
    assert hcomm.torch.failed_ranks() == [], hcomm.torch.failed_ranks()
    for k in range(20):
        t = torch.full((16,), float(dist.get_rank() + k), dtype=torch.float64)
        dist.all_reduce(t)
        same(t, torch.full((16,), float(sum(range(m)) + m * k), dtype=torch.float64), "after")
    print(f"SHRUNK rank {dist.get_rank()} of {m}", flush=True)


def _ft_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The MLP in float64 with SGD and momentum (optimizer state that a restart must carry)."""
    torch.manual_seed(0)
    model = _mlp().double()
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _ft_step(ddp: torch.nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> float:
    x, y = _batch("mlp", step, rank)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(x.double()), y)
    loss.backward()
    opt.step()
    return loss.item()


def ddp_shrink() -> None:
    """DDP in float64 on the default group; at step JOB_KILL_AT rank 0 saves the model and
    the optimizer (JOB_CKPT) and the last rank dies by SIGKILL. The survivors catch the error
    of that step, ask hcomm.torch.failed_ranks, shrink the default group without the failed
    (dist.shrink_group, revoking first), build DDP again on the new group and redo the step;
    each prints its loss of every step from JOB_KILL_AT on (``LOSS step float.hex``), which
    the test compares with a fresh run of the survivors from the checkpoint (ddp_resume)."""
    import gc
    import signal

    from torch.nn.parallel import DistributedDataParallel as DDP

    import hcomm.torch

    steps, kill_at = int(os.environ["JOB_STEPS"]), int(os.environ["JOB_KILL_AT"])
    rank, n = dist.get_rank(), dist.get_world_size()
    model, opt = _ft_model()
    ddp: torch.nn.Module | None = DDP(model)
    pg = dist.distributed_c10d._get_default_group()
    step = 0
    while step < steps:
        if step == kill_at and dist.get_world_size() == n:
            if rank == 0:
                tmp = os.environ["JOB_CKPT"] + ".tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp)
                os.replace(tmp, os.environ["JOB_CKPT"])
            if rank == n - 1:
                os.kill(os.getpid(), signal.SIGKILL)
        assert ddp is not None
        try:
            loss = _ft_step(ddp, opt, step, dist.get_rank())
        except Exception as e:
            print(f"RAISED rank {rank} at step {step}: {type(e).__name__}", flush=True)
            if step != kill_at:
                raise
        else:
            if step >= kill_at:
                print(f"LOSS {step} {loss.hex()}", flush=True)
            step += 1
            continue
        # The failed step: no optimizer step was taken; the old DDP's hooks go with it.
        ddp = None
        gc.collect()
        # A rank that read another's revoke before its own engine saw the loss waits for it.
        until = time.monotonic() + 10
        while not (failed := hcomm.torch.failed_ranks(pg)):
            if time.monotonic() > until:
                fail("no failed rank known 10 s after the error")
            time.sleep(0.01)
        print(f"FAILED rank {rank}: {failed}", flush=True)
        pg = dist.shrink_group(failed, group=pg, shrink_flags=dist.distributed_c10d.SHRINK_ABORT)
        if dist.get_world_size() != n - len(failed) or dist.get_rank() != rank:
            fail(f"shrunk to rank {dist.get_rank()} of {dist.get_world_size()}")
        ddp = DDP(model, process_group=pg)
    print(f"DONE rank {rank} of {dist.get_world_size()}", flush=True)


def ddp_resume() -> None:
    """The reference of ddp_shrink: a fresh job of the survivors that loads its checkpoint
    and trains the same steps on the same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    steps, start = int(os.environ["JOB_STEPS"]), int(os.environ["JOB_KILL_AT"])
    model, opt = _ft_model()
    ckpt = torch.load(os.environ["JOB_CKPT"])
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    ddp = DDP(model)
    for step in range(start, steps):
        loss = _ft_step(ddp, opt, step, dist.get_rank())
        print(f"LOSS {step} {loss.hex()}", flush=True)


def fault_skip() -> None:
    """The last rank skips the second all-reduce: the others raise naming the op, its
    sequence number and the missing rank. The skipper stays alive (so that the others time
    out rather than lose it) until each of them left a file in JOB_DONE_DIR, or for
    JOB_TIMEOUT + 6 s at most."""
    rank, n = dist.get_rank(), dist.get_world_size()
    done = os.environ["JOB_DONE_DIR"]
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == n - 1:
        end = time.monotonic() + float(os.environ.get("JOB_TIMEOUT", "5")) + 6
        while len(os.listdir(done)) < n - 1 and time.monotonic() < end:
            time.sleep(0.05)
        os._exit(0)
    try:
        dist.all_reduce(t)
    except Exception as e:
        print(f"RAISED rank {rank}: {e}", flush=True)
        open(os.path.join(done, str(rank)), "w").close()
        os._exit(0)
    fail("no error though a rank skipped the all-reduce")


def lifecycle() -> None:
    """Init methods and teardown: checked by the caller from the process's resources."""
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    same(t, torch.tensor([float(sum(range(dist.get_world_size())))]), "all_reduce")


def main() -> None:
    # Under hcommrun: torch's env:// variables from hcommrun's (MASTER_* come from the caller).
    for var, ours in (("RANK", "HCOMM_RANK"), ("WORLD_SIZE", "HCOMM_SIZE")):
        if var not in os.environ and ours in os.environ:
            os.environ[var] = os.environ[ours]
    scenarios = sys.argv[1].split(",")
    for cycle in range(int(os.environ.get("JOB_CYCLES", "1"))):
        for scenario in scenarios:
            run(scenario, cycle)


_STORE: Any = None


def run(scenario: str, cycle: int) -> None:
    backend = os.environ.get("JOB_BACKEND", "hcomm")
    timeout = timedelta(seconds=float(os.environ.get("JOB_TIMEOUT", "60")))
    # JOB_INIT: tcp://..., file://..., "store" or env://; a comma list: one per cycle
    inits = os.environ.get("JOB_INIT", "").split(",")
    init = inits[cycle % len(inits)]
    if init == "store":
        global _STORE
        if _STORE is None:
            _STORE = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                int(os.environ["WORLD_SIZE"]),
                int(os.environ["RANK"]) == 0,
                timeout=timeout,
            )
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"cycle{cycle}", _STORE),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
    elif init:
        dist.init_process_group(
            backend,
            init_method=init,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )
    else:
        dist.init_process_group(backend, timeout=timeout)
    globals()[scenario]()
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"OK {scenario} {cycle}", flush=True)
    dist.destroy_process_group()
    if scenario == "lifecycle":
        report_leftovers(cycle)


def resources() -> tuple[int, int, int]:
    """This process's sockets, hcomm shared-memory mappings and threads (native ones too)."""
    socks = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            socks += os.readlink(f"/proc/self/fd/{f}").startswith("socket:")
        except OSError:
            pass
    with open("/proc/self/maps") as fh:
        shm = sum(1 for ln in fh if "/dev/shm/" in ln or "memfd:hcomm" in ln)
    return socks, shm, len(os.listdir("/proc/self/task"))


BEFORE = resources()


def report_leftovers(cycle: int) -> None:
    """After destroy_process_group: what is left of what hcomm opened (torch's own store
    client stays until its object goes, so it is let go first)."""
    import gc

    gc.collect()
    time.sleep(0.5)
    print(f"LEFT rank {os.environ['RANK']} cycle {cycle} {resources()}", flush=True)


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
