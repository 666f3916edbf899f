#!/usr/bin/env bash
# flight_overhead.sh - what the flight recorder costs on the fast path: hcomm_perf on 2 ranks
# pinned one per core (hcommrun --bind-to core), the recorder on (the default
# HCOMM_TRACE_BUFFER) against off (HCOMM_TRACE_BUFFER=0), the same binaries in the same run,
# interleaved (the order alternates per round, so both see the same load).
# Prints one line per configuration and round, `size:time(us)` for every size, then per size
# the medians of both and the cost (on / off - 1).
#
# Usage: [BIN=target/release] [ROUNDS=7] [ITERS=200000] [SIZES="8 1M"] [ARGS="allreduce"] \
#          bench/flight_overhead.sh
# Each size runs with -n ITERS (8 B) or as many iterations as --time-target 0.5 gives (larger
# sizes); the tools must be built (cargo build --release -p hcomm-tools --bins).
set -euo pipefail
BIN=$(realpath "${BIN:-target/release}")
ROUNDS=${ROUNDS:-7}
ITERS=${ITERS:-200000}
SIZES=${SIZES:-"8 1M"}
ARGS=${ARGS:-allreduce}

# The times come from hcomm_perf's JSON (-J), which has more digits than its table.
perf() { # trace_buffer size
    local n=(--time-target 0.5)
    [ "$2" = 8 ] && n=(-n "$ITERS" -w 1000)
    rm -f "$json"
    env ${1:+HCOMM_TRACE_BUFFER=$1} timeout 300 "$BIN/hcommrun" -n 2 --bind-to core -- \
        "$BIN/hcomm_perf" $ARGS -b "$2" -e "$2" "${n[@]}" -J "$json" >/dev/null 2>&1 || true
    python3 -c "import json, sys
print(' '.join(f'{r[\"size\"]}:{r[\"time_us\"]:.3f}' for r in json.load(open(sys.argv[1]))), end=' ')" \
        "$json" 2>/dev/null || echo -n "$2:failed "
}

results=$(mktemp)
json=$(mktemp --suffix .json)
trap 'rm -f "$results" "$json"' EXIT
echo "# flight_overhead.sh ROUNDS=$ROUNDS SIZES=\"$SIZES\" ARGS=\"$ARGS\", load at start $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="on off"; else order="off on"; fi
    for conf in $order; do
        line=""
        for size in $SIZES; do
            if [ "$conf" = on ]; then line+=$(perf "" "$size"); else line+=$(perf 0 "$size"); fi
        done
        echo "$conf $line load=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$results"
    done
done

echo "# medians (us); cost = on / off - 1"
python3 - "$results" <<'EOF'
import collections, statistics, sys
d = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    name, *cols = line.split()
    for c in cols:
        if c.startswith("load=") or c.endswith(":failed"):
            continue
        size, t = c.split(":")
        d[name][int(size)].append(float(t))
for size in sorted(d["on"]):
    on, off = statistics.median(d["on"][size]), statistics.median(d["off"][size])
    print(f"{size} B: on {on:.4f} off {off:.4f} cost {100 * (on / off - 1):+.1f}%"
          f"  (on {' '.join(f'{x:g}' for x in d['on'][size])}; off {' '.join(f'{x:g}' for x in d['off'][size])})")
EOF
