#!/usr/bin/env bash
# observe_overhead.sh - what the statistics of hcomm_profiler cost: hcomm_perf on 2 ranks pinned
# one per core, interleaved runs of three configurations:
#   base     the tools of BASE (a directory with hcommrun and hcomm_perf built before the
#            statistics existed, e.g. from commit 00249b7)
#   new      the tools of NEW (hcommrun, hcomm_perf, hcomm_profiler of this tree), nobody watching
#   watched  NEW again, with `hcomm_profiler --job --interval 100` attached as soon as a
#            rank's statistics are open
# Prints one line per configuration and run, `size:time(us)` for every size, then the medians.
#
# Usage: BASE=/path/to/old/bin NEW=target/release [ROUNDS=7] [ARGS="allreduce -b 8 -e 32K -f 8"] \
#          bench/observe_overhead.sh
set -euo pipefail
BASE=${BASE:?set BASE to a directory with hcommrun and hcomm_perf built before the statistics}
NEW=${NEW:-target/release}
ROUNDS=${ROUNDS:-7}
ARGS=${ARGS:-"allreduce -b 8 -e 32K -f 8"}
BASE=$(realpath "$BASE")
NEW=$(realpath "$NEW")

row() { grep -E '^\[0\] +[0-9]' | awk '{printf "%s:%s ", $2, $7} END {print ""}'; }
perf() { "$1/hcommrun" -n 2 sh -c "exec taskset -c \$HCOMM_RANK $1/hcomm_perf $ARGS"; }

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$ROUNDS"); do
    echo "base $(perf "$BASE" 2>&1 | row)" | tee -a "$results"
    echo "new $(perf "$NEW" 2>&1 | row)" | tee -a "$results"
    out=$(mktemp)
    perf "$NEW" >"$out" 2>&1 &
    job=$!
    # A rank of the job, once its statistics (a memfd) are open.
    pid=""
    for _ in $(seq 1 2000); do
        pid=$(pgrep -n -f "^$NEW/hcomm_perf" || true)
        if [ -n "$pid" ] && ls -l "/proc/$pid/fd" 2>/dev/null | grep -q 'memfd:hcomm-.*-stats'; then
            break
        fi
        sleep 0.002
    done
    "$NEW/hcomm_profiler" --pid "$pid" --job --interval 100 >/dev/null 2>"$out.prof" &
    prof=$!
    wait "$job"
    kill "$prof" 2>/dev/null || true
    wait "$prof" 2>/dev/null || true
    echo "watched $(row <"$out")" | tee -a "$results"
    # The profiler says nothing unless it failed to attach.
    if [ -s "$out.prof" ]; then cat "$out.prof" >&2; fi
    rm -f "$out" "$out.prof"
done

echo "# medians (us)"
python3 - "$results" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    name, *cols = line.split() or [""]
    for c in cols:
        size, t = c.split(":")
        d[name][int(size)].append(float(t))
for size in sorted(d["base"]):
    print(size, *(f"{n} {statistics.median(d[n][size]):.2f}" for n in ("base", "new", "watched")))
EOF
