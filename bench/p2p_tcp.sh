#!/usr/bin/env bash
# p2p_tcp.sh - hcomm vs Open MPI, point-to-point over TCP between two "hosts" on one machine.
#
# Two network namespaces (hc_a, hc_b) joined by a veth pair named hc_veth at both ends;
# 10.78.0.1/24 and 10.78.0.2/24 exist only inside them, so all traffic stays on the veth.
# Rank 0 runs in hc_a pinned to CPU 0, rank 1 in hc_b pinned to CPU 1.
#   * hcomm:    hcomm_perf pingpong and stream, ranks started by hand (HCOMM_RANK/SIZE,
#               HCOMM_ROOT_ADDR=10.78.0.1:<random port>, a random HCOMM_JOB_SECRET,
#               HCOMM_HOST_ID=<namespace>: two hosts to hcomm, which otherwise sees one
#               hostname and links the ranks through shared memory); the script stops with
#               an error when rank 0's transport line shows a peer through shared memory or
#               no message over TCP
#   * Open MPI: mpi_bench -o pingpong,stream with --mca pml ob1 --mca btl tcp,self restricted
#               to hc_veth, one rank per namespace (mpirun's rsh launcher through
#               netns_rsh.sh, an ssh stand-in that calls `ip netns exec`)
# then prints hcomm/Open MPI ratios at 8 B, 64 KiB, 1 MiB and 16 MiB. The namespaces are
# removed on exit, also on error or Ctrl-C. Needs root (except --local).
#
# hcomm runs twice: with its defaults, and with HCOMM_SPIN_US=$SPIN_US (default 1000000: a
# waiting rank polls instead of sleeping, as Open MPI does), since each rank has a core.
#
# usage: bench/p2p_tcp.sh [--local] [--max SIZE] [--target SECS] [--no-mpi] [--no-build] [--no-spin]
#   --local      no namespaces: both ranks on 127.0.0.1 (quick check, no root needed)
#   --max SIZE   largest message (default 16M; K/M/G = powers of 1024)
#   --target S   seconds of timed iterations per size (default 0.2)
#   --no-mpi     skip Open MPI
#   --no-build   use the hcomm_perf binary as it is
#   --no-spin    skip the HCOMM_SPIN_US run
# Environment: HCOMM_* settings (HCOMM_TCP_STREAMS, HCOMM_TIMEOUT (default here 30 s), ...)
# reach the ranks; RUN_TIMEOUT (default 300 s) bounds each run; FALLBACK_WINDOW (default 8)
# is the stream window of the retry when hcomm's stream run with the default window fails.
#
# Output: results/p2p_tcp_summary.txt (--local: results/p2p_tcp_local_summary.txt) with the
# comparison and every raw table; raw files results/p2p_tcp_*.tmp (git-ignored).
set -u
. "$(dirname "$0")/common.sh" || exit 1

LOCAL=0 MAX=16M TARGET=0.2 BUILD=1 MPI=1 SPIN=1
SPIN_US=${SPIN_US:-1000000}
while [ $# -gt 0 ]; do
  case "$1" in
    --no-spin) SPIN=0 ;;
    *) common_arg "$@"; shift $ARGN ;;
  esac
  shift
done
MAXB=$(to_bytes "$MAX") || exit 2

bench_setup p2p_tcp hc_a hc_b hc_veth 10.78.0.1 10.78.0.2
FALLBACK_WINDOW=${FALLBACK_WINDOW:-8}

# ---- build ---------------------------------------------------------------------
build_hcomm
build_mpi

# ---- namespaces ------------------------------------------------------------------
ns_up
[ $LOCAL = 0 ] && log "# routes in $NSA: $(ip -n $NSA route | tr '\n' ';')"

# ---- hcomm ---------------------------------------------------------------------
# hcomm OUTNAME OP ARGS...: rank 0 in A, rank 1 in B, fresh port and secret each run.
hcomm() {
  local name=$1; shift
  hcomm_ranks "$name" "$VARIANT_ENV" "$@" -b 8 -e "$MAXB"
  log "$(printf 'hcomm %-22s %-22s rank0 rc=%-3s rank1 rc=%-3s %4d.%d s' "$name" "$VARIANT_ENV" $RUN_RC0 $RUN_RC1 $((RUN_MS / 1000)) $((RUN_MS % 1000 / 100)))"
  hcomm_notes "$name"
  [ $RUN_RC0 = 0 ] && [ $RUN_RC1 = 0 ]
}

# run_ops VARIANT: pingpong and stream for one hcomm variant ("" = defaults, "spin_" =
# HCOMM_SPIN_US=$SPIN_US). A failed stream run is retried with a smaller window.
declare -A STREAMF
NOTES=()
run_ops() {
  local v=$1
  hcomm "${v}pingpong" pingpong
  local k=${v%_}
  k=${k:-default}
  STREAMF[$k]=${v}stream
  if ! hcomm "${v}stream" stream; then
    log "hcomm ${v}stream with the default window (64, as Open MPI's) failed: retrying with --window $FALLBACK_WINDOW"
    hcomm "${v}stream_w$FALLBACK_WINDOW" stream --window "$FALLBACK_WINDOW"
    STREAMF[$k]=${v}stream_w$FALLBACK_WINDOW
    NOTES+=("hcomm ${v}stream FAILED with the default window 64; its numbers below use --window $FALLBACK_WINDOW (sizes >= $((8388608 / FALLBACK_WINDOW)) B have the same window as Open MPI)")
  fi
}
VARIANT_ENV=""
run_ops ""
if [ $SPIN = 1 ]; then
  VARIANT_ENV="HCOMM_SPIN_US=$SPIN_US"
  run_ops spin_
  VARIANT_ENV=""
fi

# ---- Open MPI --------------------------------------------------------------------
if [ $MPI = 1 ]; then
  ompi_setup
  ompi_run ompi -b 8 -e "$MAXB" -o pingpong,stream
  log "$(printf 'Open MPI pingpong,stream     rc=%-3s %4d.%d s' $RUN_RC $((RUN_MS / 1000)) $((RUN_MS % 1000 / 100)))"
  ompi_notes ompi
fi

teardown

# ---- comparison ------------------------------------------------------------------
line() { # line LABEL HCOMM HCOMM_SPIN OMPI
  printf '%-31s %10s %10s %10s %10s %10s\n' "$1" "${2:-n/a}" "${3:-n/a}" "${4:-n/a}" \
    "$(ratio "$2" "$4")" "$(ratio "$3" "$4")"
}
{
  summary_head "hcomm vs Open MPI, point-to-point over TCP ($MODE), bench/p2p_tcp.sh"
  echo "# time target ${TARGET} s per size, sizes 8..$MAXB B; time = median (pingpong: half round trip;"
  echo "# stream: per message, window 64 capped at 8 MiB in flight); GB/s = 1e9 B/s"
  run_log
  for n in ${NOTES[@]+"${NOTES[@]}"}; do echo "# NOTE: $n"; done
  echo "#"
  echo "# hcomm = defaults; spin = HCOMM_SPIN_US=$SPIN_US; ratio = hcomm / Open MPI: for latency (us)"
  echo "# below 1 means hcomm is faster, for bandwidth (GB/s) above 1 means hcomm is faster"
  printf '%-31s %10s %10s %10s %10s %10s\n' "metric" "hcomm" "spin" "Open MPI" "ratio" "spin ratio"
  for s in 8 65536 1048576 16777216; do
    line "pingpong $s B half-RTT (us)" "$(hc pingpong $s 6)" \
      "$(hc spin_pingpong $s 6)" "$(mpi ompi pingpong $s 4)"
  done
  for s in 8 65536 1048576 16777216; do
    line "stream $s B (GB/s)" "$(gbps $s "$(hc "${STREAMF[default]}" $s 6)")" \
      "$(gbps $s "$(hc "${STREAMF[spin]:-none}" $s 6)")" "$(gbps $s "$(mpi ompi stream $s 4)")"
  done
  raw_tables "hcomm_perf" pingpong "${STREAMF[default]}"
  raw_tables "hcomm_perf (HCOMM_SPIN_US=$SPIN_US)" spin_pingpong ${STREAMF[spin]:-}
  [ $MPI = 1 ] && raw_tables "Open MPI mpi_bench (btl tcp,self)" ompi
} >"$SUMMARY"
sed -n '/^metric/,/^$/p' "$SUMMARY"
echo "summary: $SUMMARY"
