"""Point-to-point calls and the kinds of buffers hcomm accepts."""

from __future__ import annotations

import pytest
from conftest import job


@pytest.mark.timeout(60)
def test_p2p_and_buffer_kinds() -> None:
    job(
        3,
        """
        import ml_dtypes
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        # numpy, blocking
        a = np.arange(6, dtype=np.int32) * (rank + 1)
        got = np.zeros(6, np.int32)
        if rank == 0:
            comm.send(a, 1, tag=5)
        elif rank == 1:
            assert comm.recv(got, 0, tag=5) == 24
            assert (got == np.arange(6) * 1).all()
        # sendrecv around the ring; a receive buffer larger than the message
        out = np.zeros(10, np.int32)
        n = comm.sendrecv(a, nxt, out, prv, sendtag=1, recvtag=1)
        assert n == 24 and (out[:6] == np.arange(6) * (prv + 1)).all(), (n, out)
        # isend/irecv with test() and wait_all; bytearray and memoryview
        inbox = bytearray(8)
        r1 = comm.irecv(memoryview(inbox), prv, tag=2)
        r2 = comm.isend(bytes([rank] * 8), nxt, tag=2)
        assert hcomm.wait_all([r1, r2]) == [8, 8]
        assert inbox == bytes([prv] * 8) and r1.test() and r1.wait() == 8
        # numpy bfloat16 (no buffer protocol: __array_interface__)
        b = np.full(5, rank, dtype=ml_dtypes.bfloat16)
        comm.allreduce(b)
        assert (b.astype(np.float32) == sum(range(size))).all()
        # 2-D and Fortran-ordered arrays are contiguous too
        m = np.asfortranarray(np.ones((3, 2)))
        comm.allreduce(m)
        assert (m == size).all()
        # a large message (several chunks) without copies
        big = np.full(1 << 20, rank, np.uint8)
        dst = np.empty(1 << 20, np.uint8)
        comm.sendrecv(big, nxt, dst, prv)
        assert (dst == prv).all()
        comm.destroy()
        """,
    )


@pytest.mark.timeout(90)
@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_receive_from_any_source(transport: str) -> None:
    """Every rank sends to rank 0, which receives from hcomm.ANY_SOURCE (blocking recv,
    recv_any, irecv with Request.source), eager and rendezvous sizes, each sender's messages
    in order; a too-small buffer raises Truncated."""
    env = {"HCOMM_TRANSPORT": "tcp"} if transport == "tcp" else None
    job(
        3,
        """
        sizes = [3, 100_000, 1 << 20]
        reqs = [
            comm.isend(np.full(n, rank * 10 + i, np.int32), 0, tag=4)
            for i, n in enumerate(sizes)
        ]
        if rank == 0:
            seen = {r: [] for r in range(size)}
            buf = np.zeros(1 << 20, np.int32)
            # three ways to take the messages: recv with ANY_SOURCE, recv_any, irecv
            n = comm.recv(buf, hcomm.ANY_SOURCE, tag=4)
            v = int(buf[0])
            seen[v // 10].append((v % 10, n))
            for _ in range(size * len(sizes) // 2 - 1):
                n, src = comm.recv_any(buf, tag=4)
                assert (buf[: n // 4] == buf[0]).all()
                assert int(buf[0]) // 10 == src, (buf[0], src)
                seen[src].append((int(buf[0]) % 10, n))
            pending = []
            for _ in range(size * len(sizes) - size * len(sizes) // 2):
                b = np.zeros(1 << 20, np.int32)
                pending.append((comm.irecv(b, hcomm.ANY_SOURCE, tag=4), b))
            for r, b in pending:
                assert r.source is None or r.test()
                n = r.wait()
                assert r.source == int(b[0]) // 10, (r.source, b[0])
                seen[r.source].append((int(b[0]) % 10, n))
            for r in range(size):
                assert seen[r] == [(i, 4 * m) for i, m in enumerate(sizes)], seen
            # a specific irecv names its source at once
            r = comm.irecv(np.zeros(1, np.int32), 1, tag=6)
            assert r.source == 1
            assert r.wait() == 4
        if rank == 1:
            comm.send(np.ones(1, np.int32), 0, tag=6)
        hcomm.wait_all(reqs)
        comm.barrier()
        if rank == 1:
            comm.send(np.zeros(10, np.int32), 0, tag=7)
        if rank == 0:
            try:
                comm.recv_any(np.zeros(2, np.int32), tag=7)
            except hcomm.Truncated:
                pass
            else:
                raise AssertionError("no Truncated")
        comm.barrier()
        comm.destroy()
        """,
        env=env,
    )


@pytest.mark.timeout(90)
def test_torch_tensors() -> None:
    """torch CPU tensors go through __dlpack__, used in place (importing torch is slow: one
    job of two ranks)."""
    job(
        2,
        """
        import torch
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        t = torch.full((4,), float(rank), dtype=torch.float32)
        comm.allreduce(t)
        assert t.tolist() == [float(sum(range(size)))] * 4, t
        tb = torch.full((3,), rank + 1, dtype=torch.bfloat16)
        comm.allreduce(tb, op=hcomm.MAX)
        assert tb.tolist() == [float(size)] * 3
        ti = torch.zeros(2, dtype=torch.int64)
        req = comm.irecv(ti, prv, tag=3)
        comm.send(torch.tensor([rank, 7]), nxt, tag=3)
        assert req.wait() == 16 and ti.tolist() == [prv, 7]
        tt = torch.zeros(2 * size, dtype=torch.bool)
        comm.allgather(torch.tensor([True, rank == 0]), tt)
        assert tt.tolist() == [True, True] + [True, False] * (size - 1), tt
        # non-contiguous tensors are refused, torch's refusal of tensors that need grad is passed on
        try:
            comm.allreduce(torch.zeros(4, 4)[:, 0])
            raise SystemExit("not refused")
        except hcomm.InvalidArgument as e:
            assert "not contiguous" in str(e)
        try:
            comm.allreduce(torch.zeros(2, requires_grad=True))
            raise SystemExit("not refused")
        except hcomm.InvalidArgument as e:
            assert "__dlpack__" in str(e)
        comm.destroy()
        """,
        timeout=80,
    )


@pytest.mark.timeout(60)
def test_split_dup_context_manager() -> None:
    job(
        4,
        """
        sub = comm.split(rank % 2, key=-rank)
        assert sub.size == 2 and sub.rank == (0 if rank >= 2 else 1), (sub.rank, rank)
        x = np.array([rank], np.int64)
        sub.allreduce(x)
        assert x[0] == (0 + 2 if rank % 2 == 0 else 1 + 3)
        assert comm.split(-1 if rank == 0 else 0) is None or rank != 0
        with comm.dup() as d:
            y = np.array([1.0])
            d.allreduce(y)
            assert y[0] == size
        try:
            d.barrier()
            raise SystemExit("a destroyed communicator still works")
        except hcomm.InvalidArgument as e:
            assert "destroyed" in str(e)
        assert comm.local_size == 4 and comm.local_rank == rank
        comm.destroy()
        comm.destroy()
        """,
    )
