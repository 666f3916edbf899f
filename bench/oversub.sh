#!/usr/bin/env bash
# oversub.sh - more ranks than cores: hcomm against Open MPI (`mpirun --oversubscribe`) with N
# local ranks on this host, unpinned, in the same run, hcomm and Open MPI interleaved (the
# order alternates per round) so that both see the same load. Per N and round:
#   init        slowest rank's init: hcomm's examples/startup (init_ms) against MPI_Init timed
#               the same way (clock around the call, the slowest rank); also each launch's wall
#               time (init, an all-reduce, a barrier, finalize)
#   warm        1 KiB and 1 MiB all-reduce after warm-up (hcomm_perf / mpi_bench defaults:
#               20 warm-up calls, then about -t seconds of calls; median, slowest rank)
#   first       the same sizes timed from the first call: no warm-up, FIRST calls (median)
# Prints per N the medians over rounds and hcomm's ratio to Open MPI's time (target: <= 0.8),
# with the load average seen at the start, the end and each launch (the host is shared).
#
# hcomm_perf checks one call per size against its reference (-c 1) up to CHECK_MAX ranks
# (default 32): its checker generates every rank's inputs in each rank, which at 128 ranks and
# 1 MiB takes ~200 MB per rank, more than this host has for 128 of them (the OOM killer ends
# the job); above it the runs are timed unchecked (-c 0), as the correctness of large jobs is
# the tests' business. mpi_bench always checks (a closed form).
#
# Usage: [NS="8 32 128"] [ROUNDS=3] [T=0.3] [FIRST=20] [CHECK_MAX=32] bench/oversub.sh [--no-build]
# Needs: Open MPI (mpicc.openmpi, mpirun.openmpi; as root it sets OMPI_ALLOW_RUN_AS_ROOT=1
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1). Builds hcomm's release tools and examples unless
# --no-build. RUN_TIMEOUT (default 600 s) bounds each launch. Summary:
# bench/results/oversub_summary.txt; raw outputs in bench/results/oversub.*.tmp.
set -euo pipefail
NS=${NS:-"8 32 128"}
ROUNDS=${ROUNDS:-3}
T=${T:-0.3}
FIRST=${FIRST:-20}
CHECK_MAX=${CHECK_MAX:-32}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}
BUILD=1
for a in "$@"; do
    case "$a" in
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "oversub.sh: unknown argument '$a' (see --help)" >&2; exit 2 ;;
    esac
done
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
R=$HERE/results
RAW=$R/oversub
SUMMARY=$R/oversub_summary.txt
mkdir -p "$R" "$HERE/build"
rm -f "$RAW".*.tmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-120}
SIZES=1024,1048576

if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --release -q -p hcomm-tools --bins --examples)
fi
MPIBENCH=$HERE/build/mpi_bench_ompi
MPIINIT=$HERE/build/mpi_init_ompi
mpicc.openmpi -O2 -Wall -Wno-stringop-overflow "$HERE/mpi_bench.c" -o "$MPIBENCH"
cat >"$HERE/build/mpi_init.c" <<'EOF'
/* MPI_Init timed as examples/startup.rs times hcomm's init; then an all-reduce, a barrier,
 * finalize. Rank 0 prints the slowest rank's init as "init_ms X". */
#include <mpi.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int c, char **v) {
  double t0 = now(), init, slowest, one = 1, sum;
  MPI_Init(&c, &v);
  init = (now() - t0) * 1e3;
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&one, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  MPI_Reduce(&init, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("rank 0 init_ms %.1f sum_ok %d\n", slowest, sum == size);
  MPI_Finalize();
  return 0;
}
EOF
mpicc.openmpi -O2 -Wall "$HERE/build/mpi_init.c" -o "$MPIINIT"

load() { cut -d' ' -f1 /proc/loadavg; }
# run LIB N WHAT OUT CMD...: one launch; appends "LIB N WHAT rc wall_s load" to the index
run() {
    local lib=$1 n=$2 what=$3 out=$4 t0 t1 rc=0 l
    shift 4
    l=$(load)
    t0=$(date +%s.%N)
    timeout "$RUN_TIMEOUT" "$@" >"$out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    echo "$lib $n $what $rc $(echo "$t1 - $t0" | bc) $l $out" >>"$RAW.index.tmp"
    [ "$rc" = 0 ] || echo "oversub.sh: $lib $what on $n ranks failed (rc $rc), see $out" >&2
}
hcomm() { # n what out
    local n=$1 what=$2 out=$3 check=1
    [ "$n" -le "$CHECK_MAX" ] || check=0
    case $what in
    init) run hcomm "$n" init "$out" "$BIN/hcommrun" -n "$n" -- "$BIN/examples/startup" ;;
    warm) run hcomm "$n" warm "$out" "$BIN/hcommrun" -n "$n" -- "$BIN/hcomm_perf" allreduce \
        -b 1K -e 1M -f 1024 --time-target "$T" -c "$check" ;;
    first) run hcomm "$n" first "$out" "$BIN/hcommrun" -n "$n" -- "$BIN/hcomm_perf" allreduce \
        -b 1K -e 1M -f 1024 -w 0 -n "$FIRST" -c "$check" ;;
    esac
}
ompi() { # n what out
    local n=$1 what=$2 out=$3 m=(mpirun.openmpi --oversubscribe --bind-to none -n "$n")
    case $what in
    init) run ompi "$n" init "$out" "${m[@]}" "$MPIINIT" ;;
    warm) run ompi "$n" warm "$out" "${m[@]}" "$MPIBENCH" -s "$SIZES" -o allreduce -t "$T" ;;
    first) run ompi "$n" first "$out" "${m[@]}" "$MPIBENCH" -s "$SIZES" -o allreduce -w 0 \
        -x "$FIRST" ;;
    esac
}

START_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)
echo "# oversub.sh NS=\"$NS\" ROUNDS=$ROUNDS T=$T FIRST=$FIRST on $(hostname), $(nproc) CPUs, load at start $START_LOAD"
for round in $(seq 1 "$ROUNDS"); do
    for n in $NS; do
        for what in init warm first; do
            if [ $((round % 2)) = 1 ]; then order="hcomm ompi"; else order="ompi hcomm"; fi
            for lib in $order; do
                "$lib" "$n" "$what" "$RAW.$lib.$n.$what.r$round.tmp"
            done
        done
        echo "# round $round, $n ranks done, load $(load)"
    done
done
END_LOAD=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$RAW.index.tmp" "$START_LOAD" "$END_LOAD" "$NS" "$ROUNDS" "$T" "$FIRST" "$CHECK_MAX" >"$SUMMARY" <<'PY'
import re, statistics, sys
index, start, end, ns, rounds, t, first, check_max = sys.argv[1:]
runs = [l.split() for l in open(index)]
cell = {}   # (lib, n, measure) -> [values]
loads, fails = [], []
for lib, n, what, rc, wall, load, out in runs:
    loads.append(float(load))
    if rc != "0":
        fails.append(f"{lib} {what} on {n} ranks: rc {rc} ({out})")
        continue
    text = open(out, errors="replace").read()
    if what == "init":
        inits = [float(x) for x in re.findall(r"init_ms ([0-9.]+)", text)]
        if inits:
            cell.setdefault((lib, n, "init ms"), []).append(max(inits))
        cell.setdefault((lib, n, "launch s"), []).append(float(wall))
        continue
    for line in text.splitlines():
        f = re.sub(r"^\[\d+\]\s*", "", line).split()
        if len(f) < 6 or not f[0].isdigit():
            continue
        size = int(f[0])
        # hcomm_perf: size count type redop root time ...; mpi_bench: size count type time ...
        us, wrong = (float(f[5]), int(f[8])) if lib == "hcomm" else (float(f[3]), int(f[6]))
        if wrong:
            fails.append(f"{lib} {what} {size} B on {n} ranks: {wrong} wrong elements ({out})")
        label = "1 KiB" if size == 1024 else "1 MiB"
        cell.setdefault((lib, n, f"{label} {what} us"), []).append(us)
measures = ["init ms", "launch s", "1 KiB warm us", "1 MiB warm us", "1 KiB first us", "1 MiB first us"]
print(f"# oversub.sh: N local ranks on this host, unpinned; hcomm (hcommrun) against Open MPI "
      f"(mpirun.openmpi --oversubscribe --bind-to none), interleaved; {rounds} rounds, "
      f"warm: ~{t} s per size after 20 warm-up calls, first: {first} calls from the first")
print(f"# hcomm_perf checked one call per size up to {check_max} ranks (-c 1), above unchecked (-c 0)")
print(f"# load average at start {start}, at the end {end}; 1-min load at the launches: "
      f"min {min(loads):.2f} median {statistics.median(loads):.2f} max {max(loads):.2f}")
print("# medians over rounds (µs, init in ms, launch wall time in s); ratio = hcomm / Open MPI "
      "(target <= 0.8 for the all-reduces)")
print("| ranks | measure | hcomm | Open MPI | ratio | hcomm rounds | Open MPI rounds |")
print("|---|---|---|---|---|---|---|")
for n in ns.split():
    for m in measures:
        h, o = cell.get(("hcomm", n, m), []), cell.get(("ompi", n, m), [])
        if not h and not o:
            continue
        med = lambda v: statistics.median(v) if v else None
        hm, om = med(h), med(o)
        fmt = lambda x: "—" if x is None else f"{x:.2f}" if x < 100 else f"{x:.0f}"
        ratio = f"{hm / om:.2f}" if hm and om else "—"
        rs = lambda v: " ".join(fmt(x) for x in v)
        print(f"| {n} | {m} | {fmt(hm)} | {fmt(om)} | {ratio} | {rs(h)} | {rs(o)} |")
for f in fails:
    print(f"FAILED: {f}")
PY
cat "$SUMMARY"
