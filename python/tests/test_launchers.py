"""hcomm.init() from the environments of the real launchers: hcommrun, Open MPI's mpirun and
torchrun; and `python -m hcomm.info`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import clean_env, free_port, tool_bin

BODY = r"""
import os
import hcomm, numpy as np
comm = hcomm.init()
x = np.array([comm.rank + 1], np.int64)
comm.allreduce(x)
assert x[0] == comm.size * (comm.size + 1) // 2, x
assert comm.local_size == comm.size and 0 <= comm.local_rank < comm.size
os.write(1, f"OK {comm.rank} {comm.size} {comm._info()['launcher']}\n".encode())
comm.destroy()
"""


def check(out: subprocess.CompletedProcess[str], size: int, launcher: str) -> None:
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    # hcommrun prefixes each line with "[rank] ".
    words = [line.split() for line in out.stdout.splitlines()]
    ok = sorted(w[w.index("OK") + 1 :] for w in words if "OK" in w)
    assert ok == [[str(r), str(size), launcher] for r in range(size)], out.stdout


@pytest.mark.timeout(90)
def test_hcommrun() -> None:
    hcommrun = tool_bin("hcommrun", "HCOMM_RUN")
    out = subprocess.run(
        [str(hcommrun), "-n", "3", "--", sys.executable, "-c", BODY],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=80,
    )
    check(out, 3, "Hcomm")


@pytest.mark.timeout(90)
def test_mpirun() -> None:
    mpirun = shutil.which(os.environ.get("HCOMM_MPIRUN", "mpirun.openmpi"))
    if mpirun is None:
        pytest.fail("Open MPI's mpirun is missing: apt-get install openmpi-bin")
    env = clean_env()
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.update(HCOMM_ROOT_ADDR=f"127.0.0.1:{free_port()}", HCOMM_JOB_SECRET="pytest-mpirun")
    out = subprocess.run(
        [
            mpirun,
            "-n",
            "2",
            "--oversubscribe",
            "-x",
            "HCOMM_ROOT_ADDR",
            "-x",
            "PYTHONPATH",
            "-x",
            "PATH",
            sys.executable,
            "-c",
            BODY,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=80,
    )
    check(out, 2, "OpenMpi")


@pytest.mark.timeout(120)
def test_torchrun(tmp_path: Path) -> None:
    # torchrun is `python -m torch.distributed.run`: this interpreter's, with its torch.
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    script = tmp_path / "launched.py"
    script.write_text(BODY)
    out = subprocess.run(
        [*torchrun, "--nproc-per-node", "2", f"--master-port={free_port()}", str(script)],
        env={**clean_env(), "HCOMM_JOB_SECRET": "pytest-torchrun"},
        capture_output=True,
        text=True,
        timeout=110,
    )
    check(out, 2, "Torchrun")


@pytest.mark.timeout(60)
def test_info() -> None:
    hcommrun = tool_bin("hcommrun", "HCOMM_RUN")
    out = subprocess.run(
        [str(hcommrun), "-n", "2", "--", sys.executable, "-m", "hcomm.info"],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert out.returncode == 0, out.stderr
    import hcomm

    assert out.stdout.count(f"hcomm {hcomm.__version__}") == 2
    assert "transports: shared memory with [1]" in out.stdout
    assert "hcomm topology: 2 ranks on 1 hosts" in out.stdout
    assert "shared-memory pool" in out.stderr  # the core's HCOMM_DEBUG=1 lines


@pytest.mark.timeout(60)
def test_no_launcher_is_a_world_of_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", BODY],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=50,
    )
    check(out, 1, "Singleton")
