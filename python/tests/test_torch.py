"""The torch.distributed backend "hcomm": real jobs of real processes, launched by torchrun
or started here with torch's env:// variables; each job checks many things at once (see
torch_jobs.py) so that the suite stays short on two cores."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, tool_bin

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
JOBS = HERE / "torch_jobs.py"


def torchrun(n: int, scenario: str, timeout: float, **env: str) -> str:
    """Runs `torch_jobs.py scenario` on `n` local ranks under torchrun; its output."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(n),
        "--master-port",
        str(free_port()),
        str(JOBS),
        scenario,
    ]
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-6000:]
    return out


def spawn(
    n: int, scenario: str, timeout: float, **env: str
) -> list[subprocess.CompletedProcess[str]]:
    """Starts `n` ranks as plain processes (env:// variables, or JOB_INIT); their results."""
    port = free_port()
    procs = []
    for r in range(n):
        full = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "RANK": str(r),
            "WORLD_SIZE": str(n),
            "LOCAL_RANK": str(r),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            **{k: v.replace("{port}", str(port)) for k, v in env.items()},
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(JOBS), scenario],
                env=full,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    return results


@pytest.mark.timeout(300)
@pytest.mark.parametrize("n", [2, 4])
def test_conformance_against_gloo(n: int) -> None:
    """Every op x dtype x shape (0-dim, empty, 1-D, 2-D), non-contiguous and complex tensors,
    p2p, objects > 64 MiB, barriers, async Work and futures, subgroups and a 2-D DeviceMesh
    (4 ranks): hcomm's results against Gloo's in the same job (or exact references). Then,
    in the same job: FSDP2 fully_shard on a CPU DeviceMesh (gradients equal a single-process
    reference), a 2-stage GPipe schedule (losses and gradients equal the unsplit model's),
    and 100 rounds of all_to_all_single with random splits."""
    out = torchrun(n, "conformance,parallel", 280)
    assert "OK conformance" in out
    assert "OK parallel" in out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n", [2, 4])
def test_ddp_parity_with_gloo(n: int) -> None:
    """DDP (MLP, CNN; bucket views, unused parameters, static graph, no_sync, Join with uneven
    inputs, bf16 compression) for 30 steps: bitwise Gloo's losses and parameters with 2
    ranks, within tolerance with 4."""
    out = torchrun(n, "ddp", 220)
    assert "OK ddp" in out


@pytest.mark.timeout(200)
def test_init_methods_and_teardown(tmp_path: Path) -> None:
    """env://, tcp://, file:// and store= one after the other in one job; after each
    destroy_process_group what is left equals what the first left (the binding's
    process-wide Ctrl-C watcher): no thread, socket or segment per group."""
    # store= last: the test's own TCPStore (on MASTER_PORT) stays open after it.
    inits = ",".join(["env://", "tcp://127.0.0.1:{port}", f"file://{tmp_path / 'rdv'}", "store"])
    results = spawn(2, "lifecycle", 180, JOB_INIT=inits, JOB_CYCLES="4")
    for res in results:
        assert res.returncode == 0, res.stdout[-4000:]
        left = re.findall(r"LEFT rank \d+ cycle (\d+) \((\d+), (\d+), (\d+)\)", res.stdout)
        assert len(left) == 4, res.stdout[-2000:]
        first = left[0][1:]
        for cycle in left[1:3]:
            assert cycle[1:] == first, f"resources grow with each group: {left}"
        assert left[3][2] == "0", f"shared-memory segments left: {left}"
        assert first[1] == "0", f"shared-memory segments left: {left}"


@pytest.mark.timeout(120)
def test_no_import_needed_and_debug_detail() -> None:
    """The entry point registers the backend (torch_jobs.py imports hcomm nowhere but in the
    job that calls hcomm's own API, `hcomm.torch.failed_ranks`), also under
    TORCH_DISTRIBUTED_DEBUG=DETAIL (torch wraps the backend to check collectives)."""
    uses_hcomm_api = {"fault_shrink", "ddp_shrink"}
    tree = ast.parse(JOBS.read_text())
    importers = set()
    for top in tree.body:
        if isinstance(top, ast.FunctionDef) and top.name in uses_hcomm_api:
            continue
        for node in ast.walk(top):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n == "hcomm" or n.startswith("hcomm.") for n in names):
                importers.add(getattr(top, "name", "<module>"))
    assert not importers, f"these import hcomm: {importers}"
    results = spawn(2, "lifecycle", 100, TORCH_DISTRIBUTED_DEBUG="DETAIL")
    for res in results:
        assert res.returncode == 0, res.stdout[-4000:]


@pytest.mark.timeout(120)
def test_killed_peer_is_named() -> None:
    """SIGKILL of rank 1 of 3: every survivor raises within the timeout, naming rank 1; the
    future of a later all-reduce fails too, with a RuntimeError that names the error."""
    results = spawn(3, "fault_kill", 100, JOB_TIMEOUT="10")
    assert results[1].returncode == -9
    for r, res in enumerate(results):
        if r == 1:
            continue
        m = re.search(r"RAISED rank \d+ after ([\d.]+)s: (.*)", res.stdout)
        assert m, res.stdout[-4000:]
        assert float(m.group(1)) < 15, m.group(0)
        assert re.search(r"\brank 1\b", m.group(2)), m.group(0)
        f = re.search(r"FUTURE RAISED (\w+): (.*)", res.stdout)
        assert f, res.stdout[-4000:]
        assert f.group(1) == "RuntimeError" and "PeerLost" in f.group(2), f.group(0)


@pytest.mark.timeout(120)
def test_shrink_group_leaves_a_killed_rank_out_and_training_goes_on() -> None:
    """SIGKILL of rank 3 of 4: the survivors shrink the default group and all-reduce on."""
    results = spawn(4, "fault_shrink", 100, JOB_TIMEOUT="10")
    assert results[3].returncode == -9
    for r in range(3):
        out = results[r].stdout
        assert results[r].returncode == 0, out[-4000:]
        assert f"SHRUNK rank {r} of 3" in out, out[-4000:]


def hcommrun(n: int, scenario: str, timeout: float, *opts: str, **env: str) -> tuple[int, str]:
    """Runs `torch_jobs.py scenario` on `n` ranks under hcommrun (torch's env:// variables
    from hcommrun's and a free MASTER_PORT); its exit status and output."""
    cmd = [str(tool_bin("hcommrun", "HCOMM_RUN")), "-n", str(n), *opts, "--"]
    full = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        **env,
    }
    cmd += [sys.executable, str(JOBS), scenario]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)
    return p.returncode, p.stdout + p.stderr


def losses(out: str) -> dict[tuple[int, int], str]:
    """The `LOSS step hex` lines of a job under hcommrun, by (rank, step)."""
    found = {}
    for r, step, value in re.findall(r"^\[(\d+)\] LOSS (\d+) (\S+)$", out, re.M):
        key = (int(r), int(step))
        assert key not in found, f"rank {r} printed step {step} twice"
        found[key] = value
    return found


@pytest.mark.timeout(420)
def test_ddp_survivors_shrink_and_train_on_as_a_fresh_job_of_them_would(tmp_path: Path) -> None:
    """DDP (float64, SGD with momentum) on 4 ranks under `hcommrun --keep-going`; rank 3 dies
    by SIGKILL at step 20. The survivors catch the error, take the failed ranks from
    hcomm.torch.failed_ranks, dist.shrink_group the default group, build DDP again and redo
    step 20; their losses of steps 20-29 equal, bit for bit, those of a fresh 3-rank job
    started from the model and optimizer state rank 0 saved at step 20. (torchrun cannot run
    the first job: its agent stops every worker when one fails.)"""
    env = {"JOB_STEPS": "30", "JOB_KILL_AT": "20", "JOB_CKPT": str(tmp_path / "step20.pt")}
    # Seven torch processes on two cores: 70-130 s in all measured under load 15.
    rc, out = hcommrun(4, "ddp_shrink", 200, "--keep-going", **env)
    assert rc == 128 + 9, out[-6000:]
    for r in range(3):
        assert f"[{r}] FAILED rank {r}: [3]" in out, out[-6000:]
        assert f"[{r}] DONE rank {r} of 3" in out, out[-6000:]
    assert "[3] LOSS" not in out, out[-6000:]
    survived = losses(out)
    rc, ref_out = hcommrun(3, "ddp_resume", 200, **env)
    assert rc == 0, ref_out[-6000:]
    reference = losses(ref_out)
    assert sorted(reference) == [(r, s) for r in range(3) for s in range(20, 30)], ref_out[-6000:]
    assert survived == reference, f"after the shrink: {survived}\nfresh job: {reference}"


@pytest.mark.timeout(120)
def test_skipped_collective_is_named(tmp_path: Path) -> None:
    """The last of 3 ranks skips an all-reduce: the others raise, naming all_reduce, its
    sequence number and the missing rank."""
    results = spawn(3, "fault_skip", 100, JOB_TIMEOUT="5", JOB_DONE_DIR=str(tmp_path))
    for res in results[:2]:
        m = re.search(r"RAISED rank \d+: (.*)", res.stdout)
        assert m, res.stdout[-4000:]
        msg = m.group(1)
        assert "all_reduce #2" in msg, msg
        assert re.search(r"\b(rank|ranks|peer) \[?2\b", msg), msg


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.mark.timeout(300)
def test_two_hosts_ddp_parity() -> None:
    """Two simulated hosts (network namespaces joined by a bridge, as the Rust netns tests
    do), torchrun --nnodes 2 with 2 ranks each: DDP parity with Gloo across the hosts."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if subprocess.run(["ip", "-V"], capture_output=True).returncode != 0:
        pytest.skip("no `ip` command (iproute2)")
    job = f"htt{os.getpid()}"
    names = [f"{job}-h0", f"{job}-h1"]
    try:
        for name in names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", names[0], "link", "add", "br0", "type", "bridge")
        _ip("-n", names[0], "addr", "add", "10.78.0.1/24", "dev", "br0")
        _ip("-n", names[0], "link", "set", "br0", "up")
        _ip(
            "link",
            "add",
            "h1",
            "netns",
            names[0],
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            names[1],
        )
        _ip("-n", names[0], "link", "set", "h1", "master", "br0")
        _ip("-n", names[0], "link", "set", "h1", "up")
        _ip("-n", names[1], "addr", "add", "10.78.0.2/24", "dev", "eth0")
        _ip("-n", names[1], "link", "set", "eth0", "up")
        port = "29400"
        procs = []
        for i, name in enumerate(names):
            env = {
                **os.environ,
                "OMP_NUM_THREADS": "1",
                "HCOMM_HOST_ID": name,
                "GLOO_SOCKET_IFNAME": "br0" if i == 0 else "eth0",
            }
            cmd = [
                "ip",
                "netns",
                "exec",
                name,
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(i),
                "--nproc-per-node",
                "2",
                "--master-addr",
                "10.78.0.1",
                "--master-port",
                port,
                str(JOBS),
                "ddp",
            ]
            procs.append(
                subprocess.Popen(
                    cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
                )
            )
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=280)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise
            outs.append(out)
            assert p.returncode == 0, out[-5000:]
        assert "OK ddp" in outs[0]
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
