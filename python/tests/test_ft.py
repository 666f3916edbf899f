"""Fault tolerance from Python: a rank killed with SIGKILL, the survivors revoke, agree on the
failed set, shrink and go on with exact sums; planned removal with shrink_excluding."""

from __future__ import annotations

import pytest
from conftest import job


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
