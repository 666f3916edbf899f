#!/usr/bin/env bash
# startup.sh - start-up of large local jobs: ROUNDS launches in a row of N ranks each of
#   hcomm    hcommrun -n N of examples/startup.rs (init, an all-reduce, a barrier, finalize)
#   ompi     mpirun --oversubscribe -n N of a trivial MPI_Init/MPI_Barrier/MPI_Finalize program
# interleaved, so that both see the same machine. Prints per launch: whether it succeeded,
# its wall time, and for hcomm the slowest rank's init and finalize; then the counts of
# successes and the median wall times.
#
# Usage: [N=128] [ROUNDS=10] [MPI=1] bench/startup.sh   (MPI=0: hcomm only)
# Needs: cargo build --release -p hcomm-tools --bins --examples; for MPI=1, mpicc and mpirun
# (Open MPI; as root it sets OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1).
set -euo pipefail
N=${N:-128}
ROUNDS=${ROUNDS:-10}
MPI=${MPI:-1}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$MPI" = 1 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    printf '#include <mpi.h>\nint main(int c, char **v) { MPI_Init(&c, &v); MPI_Barrier(MPI_COMM_WORLD); MPI_Finalize(); return 0; }\n' >"$work/init.c"
    mpicc -O2 -o "$work/init" "$work/init.c"
fi

# wall CMD...: runs CMD with its output in $work/out, prints "rc seconds".
wall() {
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    "$@" >"$work/out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    echo "$rc $(echo "$t1 - $t0" | bc)"
}
# The largest value of a "name value" pair over the ranks' lines.
slowest() { grep -o "$1 [0-9.]*" "$work/out" | awk -v m=0 '{ if ($2 > m) m = $2 } END { print m }'; }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }

: >"$work/hcomm" >"$work/ompi"
ok_h=0 ok_o=0
for round in $(seq 1 "$ROUNDS"); do
    read -r rc secs < <(wall "$BIN/hcommrun" -n "$N" -- "$BIN/examples/startup")
    lines=$(grep -c 'init_ms' "$work/out" || true)
    if [ "$rc" = 0 ] && [ "$lines" = "$N" ]; then
        ok_h=$((ok_h + 1))
        echo "$secs" >>"$work/hcomm"
        echo "round $round hcomm ok ${secs}s slowest init $(slowest init_ms) ms finalize $(slowest finalize_ms) ms"
    else
        echo "round $round hcomm FAILED (rc $rc, $lines of $N ranks done) ${secs}s:"
        grep -v init_ms "$work/out" | head -5 || true
    fi
    if [ "$MPI" = 1 ]; then
        read -r rc secs < <(wall mpirun --oversubscribe -n "$N" "$work/init")
        if [ "$rc" = 0 ]; then
            ok_o=$((ok_o + 1))
            echo "$secs" >>"$work/ompi"
            echo "round $round ompi  ok ${secs}s"
        else
            echo "round $round ompi  FAILED (rc $rc) ${secs}s:"
            head -5 "$work/out" || true
        fi
    fi
done
echo "N=$N: hcomm $ok_h of $ROUNDS succeeded, median wall $(median <"$work/hcomm") s"
if [ "$MPI" = 1 ]; then
    echo "N=$N: ompi  $ok_o of $ROUNDS succeeded, median wall $(median <"$work/ompi") s"
fi
