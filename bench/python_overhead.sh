#!/usr/bin/env bash
# The Python API's own cost over the Rust call: the 8-byte all-reduce (2 float32, sum) from
# Python (bench/python_overhead.py) against `hcomm_perf allreduce -b 8 -e 8`, 2 ranks under
# hcommrun, each the median of individually timed iterations of the slowest rank, alternating
# REPS times (this VM's cross-core latency drifts between runs), then
# the medians and their difference.
#
#   bench/python_overhead.sh [REPS]      (default 5; PYTHON=... picks the interpreter with
#                                          hcomm installed; needs `cargo build --release`)
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
BIN=${CARGO_TARGET_DIR:-target}/release
PYTHON=${PYTHON:-python3}
ITERS=${ITERS:-20000}
for b in hcommrun hcomm_perf; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b: run cargo build --release" >&2; exit 1; }
done
"$PYTHON" -c "import hcomm" || { echo "hcomm is not installed for $PYTHON" >&2; exit 1; }
rust=() py=()
for ((i = 1; i <= REPS; i++)); do
    # hcommrun prefixes each line with "[rank] ".
    r=$("$BIN/hcommrun" -n 2 -- "$BIN/hcomm_perf" allreduce -b 8 -e 8 -n "$ITERS" \
        | sed 's/^\[[0-9]*\] //' | awk '!/^#/ && NF >= 6 {print $6; exit}')
    read -r p t < <("$BIN/hcommrun" -n 2 -- "$PYTHON" bench/python_overhead.py --iters "$ITERS" \
        | sed 's/^\[[0-9]*\] //')
    echo "rep $i: hcomm_perf $r us, Python $p us (of which the timer $t us)"
    rust+=("$r") py+=("$p")
done
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
mr=$(median "${rust[@]}") mp=$(median "${py[@]}")
echo "median: hcomm_perf $mr us, Python $mp us, Python's overhead $(awk -v a="$mp" -v b="$mr" 'BEGIN {printf "%.2f", a-b}') us"
