#!/usr/bin/env bash
# coll_tcp.sh - hcomm vs Open MPI, collectives over TCP between two "hosts" on one machine.
#
# Two network namespaces (hcc_a, hcc_b) joined by a veth pair named hcc_veth at both ends;
# 10.76.0.1/24 and 10.76.0.2/24 exist only inside them, so all traffic stays on the veth.
# Rank 0 runs in hcc_a pinned to CPU 0, rank 1 in hcc_b pinned to CPU 1 (the same layout as
# p2p_tcp.sh, with other names and addresses so that both can run side by side).
#   * hcomm:    hcomm_perf allreduce (float32, sum), broadcast and allgather, 8 B..--max,
#               plus one allreduce at --big (default 256M); ranks started by hand
#               (HCOMM_RANK/SIZE, HCOMM_ROOT_ADDR=10.76.0.1:<random port>, a random
#               HCOMM_JOB_SECRET, HCOMM_HOST_ID=<namespace>: two hosts to hcomm, which
#               otherwise sees one hostname and links the ranks through shared memory);
#               every result checked (-c 1); the script stops with an error when rank 0's
#               transport line shows a peer through shared memory or no message over TCP
#   * Open MPI: mpi_bench -o allreduce,bcast,allgather (and allreduce at --big) with
#               --mca pml ob1 --mca btl tcp,self restricted to hcc_veth, one rank per
#               namespace (mpirun's rsh launcher through netns_rsh.sh)
#   * hcomm only: allreduce 8 B..1 MiB with HCOMM_MISMATCH_CHECK=0 against the default (two
#               rounds each, interleaved), and allreduce 8 B..--max with HCOMM_DETERMINISTIC=1
# then prints hcomm/Open MPI ratios at 8 B (time; target hcomm <= Open MPI), 64 KiB, 1 MiB
# and 16 MiB (bus bandwidth; target at 16 MiB hcomm >= 2x Open MPI), and the costs of the
# mismatch check and of deterministic mode. The namespaces are removed on exit, also on
# error or Ctrl-C. Needs root (except --local).
#
# usage: bench/coll_tcp.sh [--local] [--max SIZE] [--big SIZE] [--target SECS] [--no-mpi]
#                          [--no-build] [--no-big] [--no-extra]
#   --local      no namespaces: both ranks on 127.0.0.1 (quick check, no root needed)
#   --max SIZE   largest size of the sweeps (default 16M; K/M/G = powers of 1024)
#   --big SIZE   the single large allreduce (default 256M)
#   --target S   seconds of timed iterations per size (default 0.2)
#   --no-mpi     skip Open MPI
#   --no-build   use the hcomm_perf binary as it is
#   --no-big     skip the large allreduce
#   --no-extra   skip the mismatch-check and deterministic runs
# Environment: HCOMM_* settings (HCOMM_TCP_STREAMS, HCOMM_SPIN_US, HCOMM_TIMEOUT (default
# here 30 s), ...) reach the hcomm ranks; RUN_TIMEOUT (default 300 s) bounds each run;
# HCOMM_PERF points at another hcomm_perf binary.
#
# Output: results/coll_tcp_summary.txt (--local: results/coll_tcp_local_summary.txt) with the
# comparison and every raw table; raw files results/coll_tcp_*.tmp (git-ignored).
set -u
. "$(dirname "$0")/common.sh" || exit 1

LOCAL=0 MAX=16M BIG=256M TARGET=0.2 BUILD=1 MPI=1 DOBIG=1 EXTRA=1
while [ $# -gt 0 ]; do
  case "$1" in
    --big) BIG=${2:?--big needs a size}; shift ;;
    --no-big) DOBIG=0 ;;
    --no-extra) EXTRA=0 ;;
    *) common_arg "$@"; shift $ARGN ;;
  esac
  shift
done
MAXB=$(to_bytes "$MAX") || exit 2
BIGB=$(to_bytes "$BIG") || exit 2
# The mismatch-check runs stop at 1 MiB (or --max when smaller).
MMB=$((MAXB < 1048576 ? MAXB : 1048576))

bench_setup coll_tcp hcc_a hcc_b hcc_veth 10.76.0.1 10.76.0.2

# ---- build ---------------------------------------------------------------------
build_hcomm
"$PERF" allreduce --help >/dev/null 2>&1 || { echo "coll_tcp.sh: $PERF has no collectives (rebuild it)" >&2; exit 1; }
build_mpi

# ---- namespaces ------------------------------------------------------------------
ns_up

# ---- hcomm (hcomm_job OUTNAME "VAR=VALUE ..." ARGS...: rank 0 in A, rank 1 in B) ---------
SWEEP="-b 8 -e $MAXB -f 2"
hcomm_job allreduce "" allreduce $SWEEP -d float32 -o sum
hcomm_job broadcast "" broadcast $SWEEP -d float32
hcomm_job allgather "" allgather $SWEEP -d float32
[ $DOBIG = 1 ] && hcomm_job allreduce_big "" allreduce -b "$BIGB" -e "$BIGB" -d float32 -o sum
if [ $EXTRA = 1 ]; then
  # Interleaved, two rounds each: the difference is small, so noise matters.
  for round in 1 2; do
    hcomm_job mm_on$round "" allreduce -b 8 -e "$MMB" -f 2 -d float32 -o sum
    hcomm_job mm_off$round "HCOMM_MISMATCH_CHECK=0" allreduce -b 8 -e "$MMB" -f 2 -d float32 -o sum
  done
  hcomm_job determ "HCOMM_DETERMINISTIC=1" allreduce $SWEEP -d float32 -o sum
fi

# ---- Open MPI --------------------------------------------------------------------
if [ $MPI = 1 ]; then
  ompi_setup
  ompi_job ompi -b 8 -e "$MAXB" -o allreduce,bcast,allgather
  [ $DOBIG = 1 ] && ompi_job ompi_big -s "$BIGB" -o allreduce
fi

teardown

# ---- comparison ------------------------------------------------------------------
# coll_rows OP MPIOP FACTOR: time at 8 B, bus bandwidth at 64 KiB, 1 MiB, 16 MiB.
coll_rows() {
  local op=$1 mop=$2 f=$3 t h m
  h=$(hc "$op" 8 6) m=$(mpi ompi "$mop" 8 4)
  if [ "$op" = allreduce ]; then t=$(ratio "$h" "$m"); cmp_line "$op 8 B time (us)" "$h" "$m" "<= 1" "$(verdict "$t" le 1)" "$(hc "$op" 8 10)"
  else cmp_line "$op 8 B time (us)" "$h" "$m" "" "" "$(hc "$op" 8 10)"; fi
  for s in 65536 1048576 16777216; do
    [ "$s" -le "$MAXB" ] || continue
    h=$(gbps $s "$(hc "$op" $s 6)" "$f") m=$(gbps $s "$(mpi ompi "$mop" $s 4)" "$f")
    if [ "$op" = allreduce ] && [ $s = 16777216 ]; then
      t=$(ratio "$h" "$m"); cmp_line "$op $s B busbw (GB/s)" "$h" "$m" ">= 2" "$(verdict "$t" ge 2)" "$(hc "$op" $s 10)"
    else
      cmp_line "$op $s B busbw (GB/s)" "$h" "$m" "" "" "$(hc "$op" $s 10)"
    fi
  done
}
# avg2 A B: the mean of two numbers (either may be missing).
avg2() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { n = (a != "") + (b != ""); if (n) printf "%.2f", (a + b) / n }'; }
{
  summary_head "hcomm vs Open MPI, collectives over TCP ($MODE, 2 ranks), bench/coll_tcp.sh" \
    "  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# time target ${TARGET} s per size, sizes 8..$MAXB B (x2), float32; time = median of the"
  echo "# slowest rank (both tools); busbw = size/time x 2(n-1)/n (allreduce), x 1 (broadcast),"
  echo "# x (n-1)/n (allgather); GB/s = 1e9 B/s; allgather size = the whole output (nccl-tests)"
  summary_runs
  cmp_head
  coll_rows allreduce allreduce 1
  if [ $DOBIG = 1 ]; then
    cmp_line "allreduce $BIGB B busbw (GB/s)" "$(gbps "$BIGB" "$(hc allreduce_big "$BIGB" 6)" 1)" \
      "$(gbps "$BIGB" "$(mpi ompi_big allreduce "$BIGB" 4)" 1)" "" "" "$(hc allreduce_big "$BIGB" 10)"
  fi
  coll_rows broadcast bcast 1
  coll_rows allgather allgather 0.5
  if [ $EXTRA = 1 ]; then
    echo
    echo "# hcomm only. Mismatch check: allreduce with the default (signature check on) vs"
    echo "# HCOMM_MISMATCH_CHECK=0, two interleaved rounds each (r1 / r2, mean); cost = on - off."
    echo "# Deterministic: allreduce with HCOMM_DETERMINISTIC=1 (fixed-order reduction) vs the"
    echo "# default run above; ratio = deterministic / default."
    printf '%-34s %24s %24s  %s\n' "metric" "check on: r1/r2 mean" "check off: r1/r2 mean" "cost"
    for s in 8 65536 1048576; do
      [ "$s" -le "$MMB" ] || continue
      a1=$(hc mm_on1 $s 6) a2=$(hc mm_on2 $s 6) b1=$(hc mm_off1 $s 6) b2=$(hc mm_off2 $s 6)
      on=$(avg2 "$a1" "$a2") off=$(avg2 "$b1" "$b2")
      cost=$(awk -v a="$on" -v b="$off" 'BEGIN { if (a != "" && b > 0) printf "%+.2f us (%+.1f%%)", a - b, (a - b) / b * 100; else print "n/a" }')
      printf '%-34s %24s %24s  %s\n' "allreduce $s B time (us)" "${a1:-?}/${a2:-?} $on" "${b1:-?}/${b2:-?} $off" "$cost"
    done
    echo
    printf '%-34s %11s %11s %7s  %s\n' "metric" "default" "determ." "ratio" "algo default -> deterministic"
    printf '%-34s %11s %11s %7s  %s\n' "allreduce 8 B time (us)" "$(hc allreduce 8 6)" "$(hc determ 8 6)" \
      "$(ratio "$(hc determ 8 6)" "$(hc allreduce 8 6)")" "$(hc allreduce 8 10) -> $(hc determ 8 10)"
    for s in 65536 1048576 16777216; do
      [ "$s" -le "$MAXB" ] || continue
      d=$(gbps $s "$(hc allreduce $s 6)" 1) x=$(gbps $s "$(hc determ $s 6)" 1)
      printf '%-34s %11s %11s %7s  %s\n' "allreduce $s B busbw (GB/s)" "$d" "$x" "$(ratio "$x" "$d")" \
        "$(hc allreduce $s 10) -> $(hc determ $s 10)"
    done
  fi
  raw_tables "hcomm_perf" allreduce allreduce_big broadcast allgather mm_on1 mm_off1 mm_on2 mm_off2 determ
  [ $MPI = 1 ] && raw_tables "Open MPI mpi_bench (btl tcp,self)" ompi ompi_big
} >"$SUMMARY"
sed -n '/^metric/,/^# ----/p' "$SUMMARY" | sed '$d'
echo "summary: $SUMMARY"
