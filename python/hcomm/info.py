"""``python -m hcomm.info``: what hcomm sees here, as ``HCOMM_DEBUG=1`` reports it.

Run it alone (a world of one rank) or under a launcher (``hcommrun -n 4 python -m
hcomm.info``): the core's own ``HCOMM_DEBUG=1`` lines go to stderr, then each rank prints
the version, its transports (which peers it reaches through shared memory, which through
TCP), the topology table and the pool's counters.
"""

from __future__ import annotations

import os
import sys

import hcomm


def main() -> int:
    os.environ.setdefault("HCOMM_DEBUG", "1")
    comm = hcomm.init()
    info = comm._info()
    shm = info["shm_peers"]
    tcp = [r for r in range(comm.size) if r != comm.rank and r not in shm]
    lines = [
        f"hcomm {hcomm.__version__} (Python {sys.version.split()[0]})",
        f"rank {comm.rank} of {comm.size}, local {comm.local_rank} of {comm.local_size}, "
        f"{info['hosts']} host(s), launcher {info['launcher']}, timeout {info['timeout']} s",
        f"transports: shared memory with {shm or 'none'}; TCP with {tcp or 'none'}",
        f"pool: {info['pool']}",
    ]
    if comm.rank == 0:
        lines.append(str(info["topology"]).rstrip())
    print("\n".join(lines), flush=True)
    comm.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
