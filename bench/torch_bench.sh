#!/usr/bin/env bash
# torch.distributed benchmark (bench/torch_bench.py): hcomm against Gloo in the same jobs, on
# 2 and 4 local ranks; the tables go to bench/results/torch_summary.txt, the numbers to
# bench/results/torch_<n>.json. PYTHON: the interpreter with torch and hcomm (.venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=bench/results/torch_summary.txt
{
    echo "# bench/torch_bench.sh, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    for n in 2 4; do
        OMP_NUM_THREADS=1 "$PYTHON" -m torch.distributed.run --nproc-per-node "$n" \
            --standalone bench/torch_bench.py --json "bench/results/torch_$n.json" "$@" \
            2>&1 | grep -v -e '^\*' -e 'OMP_NUM_THREADS' -e '^$'
    done
} | tee "$out.tmp"
mv "$out.tmp" "$out"
