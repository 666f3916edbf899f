"""Fault tolerance from Python: a rank killed with SIGKILL, the survivors revoke, agree on the
failed set, shrink and go on with exact sums; planned removal with shrink_excluding; a shrunk
communicator grown again by a new process that joins with a token."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import clean_env, job, job_procs


@pytest.mark.timeout(60)
def test_a_killed_rank_is_shrunk_out_and_the_survivors_go_on() -> None:
    out = job(
        4,
        """
        import signal
        x = np.full(64, rank + 1, np.int64)
        comm.allreduce(x)
        assert (x == 10).all(), x
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for k in range(1_000_000):
                y = np.full(64, rank + k, np.int64)
                comm.allreduce(y)
            raise SystemExit("no failure came")
        except (hcomm.PeerLost, hcomm.Aborted, hcomm.Revoked):
            pass
        comm.revoke()
        assert comm.revoked
        try:
            comm.barrier()
            raise SystemExit("the revoked communicator still works")
        except hcomm.Revoked as e:
            assert e.code == 12 and "docs/errors.md#revoked" in str(e), e
        new = comm.shrink()
        assert comm.failed() == [3], comm.failed()
        try:
            comm.agree(rank != 1)
            raise SystemExit("the failure was not reported")
        except hcomm.PeerLost as e:
            assert e.flag is False, e.flag
        assert comm.ack_failed() == 1
        assert comm.agree(True) is True
        assert (new.size, new.rank, new.epoch) == (3, rank, 1), (new.size, new.rank, new.epoch)
        for k in range(50):
            z = np.full(64, new.rank + k, np.int64)
            new.allreduce(z)
            assert (z == 3 + 3 * k).all(), (k, z)
        if new.rank != 2:
            half = new.shrink_excluding([2])
            assert half.size == 2
            w = np.full(8, half.rank + 1, np.int64)
            half.allreduce(w)
            assert (w == 3).all(), w
        print("RECOVERED", new.size)
        """,
        expect_ok=False,
    )
    for r in range(3):
        assert out[r].returncode == 0, f"rank {r}:\n{out[r].stdout}\n{out[r].stderr}"
        assert "RECOVERED 3" in out[r].stdout
    assert out[3].returncode == -9


@pytest.mark.timeout(90)
def test_a_shrunk_communicator_grows_by_a_process_that_joins_with_a_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    _, collect = job_procs(
        4,
        """
        import signal
        from pathlib import Path
        x = np.full(64, rank + 1, np.int64)
        comm.allreduce(x)
        if rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for k in range(1_000_000):
                comm.allreduce(np.full(64, k, np.int64))
            raise SystemExit("no failure came")
        except (hcomm.PeerLost, hcomm.Aborted, hcomm.Revoked):
            pass
        comm.revoke()
        shrunk = comm.shrink()
        buf = np.zeros(256, np.uint8)
        if shrunk.rank == 0:
            made = shrunk.join_token()
            buf[: len(made)] = np.frombuffer(made.encode(), np.uint8)
        shrunk.broadcast(buf, 0)
        token = bytes(buf).rstrip(b"\\0").decode()
        if shrunk.rank == 0:
            path = Path(os.environ["T_TOKEN_FILE"])
            path.with_suffix(".tmp").write_text(token)
            path.with_suffix(".tmp").rename(path)
        try:
            comm.grow(token, 1)
            raise SystemExit("the world grew with the shrunk communicator's token")
        except hcomm.InvalidArgument as e:
            assert "another communicator" in str(e), e
        grown = shrunk.grow(token, 1)
        assert (grown.size, grown.rank, grown.epoch) == (4, shrunk.rank, 2)
        for k in range(20):
            z = np.full(64, grown.rank + k, np.int64)
            grown.allreduce(z)
            assert (z == 6 + 4 * k).all(), (k, z)
        try:
            shrunk.grow(token, 1)
            raise SystemExit("the token grew twice")
        except hcomm.InvalidArgument as e:
            assert "already used" in str(e), e
        print("GROWN", grown.size)
        """,
        env={"T_TOKEN_FILE": str(token_file)},
        timeout=80,
    )
    joiner_code = textwrap.dedent(
        """
        import os, time
        from pathlib import Path
        import hcomm, numpy as np
        assert "HCOMM_JOB_SECRET" not in os.environ
        path = Path(os.environ["T_TOKEN_FILE"])
        until = time.monotonic() + 60
        while not path.exists():
            assert time.monotonic() < until, "no token came"
            time.sleep(0.01)
        grown = hcomm.join(path.read_text(), timeout=30)
        assert (grown.size, grown.rank, grown.epoch) == (4, 3, 2), (grown.size, grown.rank)
        for k in range(20):
            z = np.full(64, grown.rank + k, np.int64)
            grown.allreduce(z)
            assert (z == 6 + 4 * k).all(), (k, z)
        print("JOINED", grown.rank)
        """
    )
    env = clean_env()
    env["T_TOKEN_FILE"] = str(token_file)
    joiner = subprocess.run(
        [sys.executable, "-c", joiner_code],
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    out = collect()
    for r in range(3):
        assert out[r].returncode == 0, f"rank {r}:\n{out[r].stdout}\n{out[r].stderr}"
        assert "GROWN 4" in out[r].stdout
    assert out[3].returncode == -9
    assert joiner.returncode == 0, f"joiner:\n{joiner.stdout}\n{joiner.stderr}"
    assert "JOINED 3" in joiner.stdout
