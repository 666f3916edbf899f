"""Errors: invalid arguments refused before anything is sent, mismatches, truncation, a
killed peer, abort, a rank that never enters a collective."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import job


@pytest.mark.timeout(60)
def test_invalid_arguments_refused_before_sending() -> None:
    job(
        2,
        """
        def refused(f, *words):
            try:
                f()
            except hcomm.InvalidArgument as e:
                assert e.code == 4 and "docs/errors.md#invalid-argument" in str(e), e
                for w in words:
                    assert w in str(e), (w, str(e))
                assert isinstance(e, ValueError) and isinstance(e, hcomm.Error)
                return
            raise AssertionError(f"not refused: {words}")

        x = np.ones(4, np.float32)
        refused(lambda: comm.allreduce(x, np.zeros(4, np.float64)), "float64", "float32")
        refused(lambda: comm.allreduce(x, np.zeros(5, np.float32)), "4 elements")
        ro = np.ones(4, np.float32); ro.flags.writeable = False
        refused(lambda: comm.allreduce(x, ro), "read-only")
        refused(lambda: comm.allreduce(ro), "read-only")
        refused(lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 1]), "not contiguous")
        refused(lambda: comm.allgather(x, np.zeros(4 * size + 1, np.float32)), "elements")
        refused(lambda: comm.allreduce(x[1:], x[:3]), "overlap")
        refused(lambda: comm.allreduce(np.ones(2, np.complex64)), "format")
        refused(lambda: comm.allreduce(object()), "buffer protocol")
        refused(lambda: comm.allreduce(x, op="nope"), "op")
        refused(lambda: comm.send(x, -1), "negative")
        refused(lambda: comm.send(x, 5), "rank")
        refused(lambda: comm.send(x, 1, tag=-3), "tag")
        refused(lambda: comm.broadcast(x, root=9), "root 9")
        refused(lambda: comm.alltoall(np.ones(3, np.int8)), "equal blocks")
        refused(lambda: comm.allgatherv(x, np.zeros(8, np.float32), [1, 2, 3]), "counts")
        refused(lambda: hcomm.init(rank=1), "together")
        # Nothing of the refused calls was sent: the next calls match.
        y = np.full(3, rank + 1.0)
        comm.allreduce(y)
        assert (y == 3.0).all(), y
        comm.destroy()
        """,
    )


@pytest.mark.timeout(60)
def test_mismatch_and_truncated() -> None:
    out = job(
        2,
        """
        try:
            if rank == 0:
                comm.allreduce(np.ones(4, np.float32))
            else:
                comm.broadcast(np.ones(4, np.float32))
            raise SystemExit("no mismatch")
        except hcomm.Mismatch as e:
            assert e.code == 6 and "docs/errors.md#mismatch" in str(e)
            print("MISMATCH", e)
        """,
    )
    assert all("MISMATCH" in o.stdout for o in out)
    job(
        2,
        """
        if rank == 0:
            comm.send(np.arange(8, dtype=np.int64), 1)
        else:
            try:
                comm.recv(np.zeros(4, np.int64), 0)
                raise SystemExit("no truncation")
            except hcomm.Truncated as e:
                assert e.code == 7 and "#truncated" in str(e)
        comm.barrier()
        comm.destroy()
        """,
    )


@pytest.mark.timeout(60)
def test_killed_peer_is_named() -> None:
    out = job(
        3,
        """
        import signal, time
        comm.barrier()
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        t = time.monotonic()
        try:
            x = np.ones(1000)
            while time.monotonic() - t < 20:
                comm.allreduce(x)
            raise SystemExit("no error")
        except hcomm.PeerLost as e:
            assert e.peer == 2, (e.peer, str(e))
            print("LOST", e.peer, round(time.monotonic() - t, 1))
        """,
        expect_ok=False,
    )
    assert out[2].returncode == -9
    for r in (0, 1):
        assert out[r].returncode == 0, out[r].stderr
        assert "LOST 2" in out[r].stdout


@pytest.mark.timeout(60)
def test_abort_and_nonblocking_errors() -> None:
    job(
        2,
        """
        if rank == 0:
            req = comm.irecv(np.zeros(4), 1, tag=9)
            assert not req.test()
            comm.abort()
            try:
                req.wait()
                raise SystemExit("no error")
            except hcomm.Aborted as e:
                assert e.code == 10
            try:
                req.wait()
            except hcomm.Aborted:
                pass
        else:
            try:
                comm.recv(np.zeros(4), 0, tag=1)
                raise SystemExit("no error")
            except hcomm.Aborted:
                pass
        """,
    )


@pytest.mark.timeout(60)
def test_timeout_names_the_peer() -> None:
    job(
        2,
        """
        if rank == 0:
            try:
                comm.recv(np.zeros(2), 1, tag=4)   # rank 1 never sends tag 4
                raise SystemExit("no timeout")
            except hcomm.Timeout as e:
                assert e.code == 3 and e.peer == 1 and isinstance(e, TimeoutError), (e.peer, e)
                assert e.comm_peer == 1, (e.comm_peer, e)
        else:
            import time
            time.sleep(4)   # alive, but calling nothing
        """,
        env={"T_TIMEOUT": "1.5"},
    )


@pytest.mark.timeout(60)
def test_a_rank_that_skips_a_collective_is_named_and_dumps_its_trace(tmp_path: Path) -> None:
    job(
        3,
        """
        import json, time
        x = np.ones(4, np.int64)
        comm.allreduce(x)   # call 0, everyone
        if rank == 1:
            time.sleep(4.5)   # alive, but never enters call 1
            d = json.load(open(comm.dump_trace()))
            assert d["format"] == "hcomm-flight-recorder" and d["version"] == 1, d
            assert d["reason"] == "api" and d["rank"] == 1, d
            w = [c for c in d["communicators"] if c["comm"] == "0x1"][0]
            assert w["entered"] == 1 and w["ops"][-1]["state"] == "completed", w
        else:
            try:
                comm.allreduce(x)
                raise SystemExit("no error")
            except (hcomm.Timeout, hcomm.Aborted) as e:
                assert e.not_entered == [1], (e.not_entered, e)
                assert "never entered allreduce #1" in str(e), e
        """,
        env={"T_TIMEOUT": "2", "HCOMM_TRACE_DIR": str(tmp_path)},
    )
