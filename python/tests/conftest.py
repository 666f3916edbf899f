"""Helpers of the Python tests: jobs of real processes on this host."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def free_port() -> int:
    """A TCP port free right now, outside the kernel's ephemeral range (so that no outgoing
    connection takes it before rank 0 binds it)."""
    low, high = 20000, 32000
    try:
        lo, _ = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        high = min(high, lo)
    except (OSError, ValueError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port found")


def _code(body: str) -> str:
    return (
        "import hcomm, numpy as np, os, sys\n"
        "rank = int(os.environ['T_RANK']); size = int(os.environ['T_SIZE'])\n"
        "comm = hcomm.init(rank=rank, size=size, root_addr=os.environ['T_ADDR'],"
        " secret='pytest', timeout=float(os.environ.get('T_TIMEOUT', '30')))\n"
        + textwrap.dedent(body)
    )


def clean_env() -> dict[str, str]:
    """This environment without any launcher's variables."""
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("HCOMM_", "OMPI_", "PMI_", "PMIX_", "SLURM_")) or k in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            del e[k]
    e["PYTHONPATH"] = str(HERE)
    return e


def _default_sigint() -> None:
    """In a rank's process before it runs Python: Ctrl-C at its default, whatever the test run
    inherited. A run started in the background by a shell without job control (`make test &`
    inside a script) ignores SIGINT, the ranks would inherit that, and Python then installs no
    KeyboardInterrupt handler (nor hcomm its watcher): test_interrupt's recv ran into
    HCOMM_TIMEOUT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def job_procs(
    nranks: int,
    body: str,
    *,
    timeout: float = 60,
    env: dict[str, str] | None = None,
) -> tuple[list[subprocess.Popen[str]], Callable[[], list[subprocess.CompletedProcess[str]]]]:
    """Starts `body` in `nranks` processes joined by hcomm.init(rank=, size=, root_addr=,
    secret=); `body` sees `comm`, `rank`, `size`, `np` and `hcomm`. Returns the processes
    and a function that waits for them (killing all at `timeout`)."""
    code = _code(body)
    addr = f"127.0.0.1:{free_port()}"
    procs = []
    for r in range(nranks):
        e = clean_env()
        e.update(T_RANK=str(r), T_SIZE=str(nranks), T_ADDR=addr)
        e.update(env or {})
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=e,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_default_sigint,
            )
        )

    def collect() -> list[subprocess.CompletedProcess[str]]:
        deadline = time.monotonic() + timeout
        out = []
        for r, p in enumerate(procs):
            try:
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                so, se = p.communicate()
                pytest.fail(f"rank {r} did not finish within {timeout} s:\n{so}\n{se}")
            out.append(subprocess.CompletedProcess(p.args, p.returncode, so, se))
        return out

    return procs, collect


def job(
    nranks: int,
    body: str,
    *,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    expect_ok: bool = True,
) -> list[subprocess.CompletedProcess[str]]:
    """Runs `body` in `nranks` processes (see `job_procs`) and returns each rank's result;
    with `expect_ok`, fails unless every rank exited 0."""
    _, collect = job_procs(nranks, body, timeout=timeout, env=env)
    out = collect()
    if expect_ok:
        for r, c in enumerate(out):
            assert c.returncode == 0, f"rank {r} failed ({c.returncode}):\n{c.stdout}\n{c.stderr}"
    return out


def tool_bin(name: str, env_var: str) -> Path:
    """A binary of the workspace: `$env_var`, else target/debug/<name> (the Rust tests' build,
    which `make test` makes first)."""
    path = Path(os.environ.get(env_var, REPO / "target" / "debug" / name))
    if not path.is_file():
        pytest.fail(f"{path} is missing: build it (cargo build -p hcomm-tools) or set {env_var}")
    return path
