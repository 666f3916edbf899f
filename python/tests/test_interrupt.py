"""Ctrl-C (SIGINT) interrupts a blocking call with KeyboardInterrupt within 200 ms."""

from __future__ import annotations

import signal
import time

import pytest
from conftest import job_procs


@pytest.mark.timeout(60)
def test_ctrl_c_interrupts_blocking_recv() -> None:
    procs, collect = job_procs(
        2,
        """
        import time
        comm.barrier()
        if rank == 0:
            # Nothing between the print and the call looks for signals but the print itself
            # and the call's entry (no allocation on the way): a Ctrl-C sent after BLOCKED
            # is read lands in the call, or at its entry, which the binding treats alike.
            buf = np.zeros(4)
            print("BLOCKED", flush=True)
            try:
                comm.recv(buf, 1, tag=1)
                raise SystemExit("recv returned")
            except KeyboardInterrupt:
                print("INTERRUPTED", time.monotonic(), flush=True)
            try:
                comm.barrier()
                raise SystemExit("the communicator still works")
            except hcomm.Aborted:
                print("ABORTED", flush=True)
        else:
            try:
                comm.recv(np.zeros(4), 0, tag=2)   # never sent: rank 0's abort ends it
                raise SystemExit("recv returned")
            except hcomm.Aborted:
                print("PEER ABORTED", flush=True)
        """,
    )
    line = procs[0].stdout.readline()
    assert line.strip() == "BLOCKED", line
    time.sleep(0.3)  # most often rank 0 is in the wait by now, else at its entry
    sent = time.monotonic()
    procs[0].send_signal(signal.SIGINT)
    out = collect()
    lines = out[0].stdout.split()
    assert "INTERRUPTED" in lines and "ABORTED" in lines, out[0]
    took = float(lines[lines.index("INTERRUPTED") + 1]) - sent
    # 200 ms plus margin for two loaded cores.
    assert took < 0.5, f"KeyboardInterrupt after {took * 1000:.0f} ms"
    assert "PEER ABORTED" in out[1].stdout
