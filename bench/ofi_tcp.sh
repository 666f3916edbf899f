#!/usr/bin/env bash
# ofi_tcp.sh - hcomm over libfabric's tcp provider (HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp) vs
# hcomm's own TCP vs bare libfabric vs Intel MPI and oneCCL over the same provider, between two
# "hosts" on one machine, interleaved over several rounds (this VM is shared: compare within
# one run).
#
# Two network namespaces (hc_oa, hc_ob) joined by a veth pair named hc_oveth at both ends,
# 10.79.0.1/24 and 10.79.0.2/24; rank 0 in hc_oa pinned to CPU 0, rank 1 in hc_ob pinned to
# CPU 1, every rank of every library at nice -20 (NICE) so that the other work of the machine
# disturbs the comparison less. Per round, in this order:
#   bare  bench/ofi_pingpong.c (built here with gcc -lfabric): one RDM endpoint per process,
#         tagged ping-pong, completions read by spinning on fi_cq_read (the provider's floor)
#   tcp   hcomm_perf pingpong and allreduce (float32 sum), HCOMM_TRANSPORT=tcp
#   ofi   the same, HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp (the system's libfabric, Debian's 1.17)
#   ofi24 the same on Intel's libfabric (HCOMM_OFI_LIB=$INTEL_VENV/lib/libfabric.so.1, 2.4 in
#         the wheel, whose tcp provider Intel MPI and oneCCL use), when Intel's peers are there
#   impi  Intel MPI's mpi_bench (I_MPI_FABRICS=ofi FI_PROVIDER=tcp; hydra over netns_rsh.sh)
#   ccl   oneCCL's ccl_bench allreduce (CCL_ATL_TRANSPORT=ofi, FI_PROVIDER=tcp, no shm)
# at 8 B, 64 KiB, 1 MiB and 16 MiB (hcomm and bare: every power of two from 4 B to --max; the
# first size absorbs the making of the connections).
# Intel MPI and oneCCL come from intel/setup.sh (INTEL_VENV, default /opt/hcomm-peers/intel);
# missing, they are skipped. The summary has the median over the rounds of each library's
# time (us) per op and size, and ofi/best = hcomm ofi / the faster of Intel MPI and oneCCL
# (below 1: hcomm faster). The namespaces are removed on exit, also on error or Ctrl-C.
# Needs root.
#
# usage: bench/ofi_tcp.sh [--rounds N] [--max SIZE] [--target SECS] [--no-build] [--no-intel]
#   --rounds N   interleaved rounds (default 3)
#   --max SIZE   largest message (default 16M; K/M/G = powers of 1024)
#   --target S   seconds of timed iterations per size (default 0.2)
#   --no-build   use the hcomm_perf binary as it is
#   --no-intel   skip Intel MPI and oneCCL
# Environment: HCOMM_* settings (HCOMM_OFI_EAGER_LIMIT, HCOMM_OFI_WRITE_THRESHOLD, ...) reach
# the hcomm ranks; RUN_TIMEOUT (default 300 s) bounds each run; NICE (default -20) the ranks'
# niceness.
#
# Output: results/ofi_tcp_summary.txt with the comparison and every raw table of the last
# round; raw files results/ofi_tcp_netns.*.tmp (git-ignored).
set -u
. "$(dirname "$0")/common.sh" || exit 1

ofi_args "$@"
SIZES="8 65536 1048576 16777216"

ofi_setup ofi_tcp hc_oa hc_ob hc_oveth 10.79.0.1 10.79.0.2
command -v fi_info >/dev/null || { echo "$NAME: fi_info not found: is libfabric installed?" >&2; exit 1; }
BARE=$HERE/build/ofi_pingpong
if [ ! -x "$BARE" ] || [ "$HERE/ofi_pingpong.c" -nt "$BARE" ]; then
  gcc -O2 -Wall "$HERE/ofi_pingpong.c" -o "$BARE" -lfabric || { echo "$NAME: cannot build ofi_pingpong (libfabric-dev?)" >&2; exit 1; }
fi
ns_up

# bare_run OUTNAME: bench/ofi_pingpong between the namespaces, the client's table to RAW.OUTNAME.tmp.
bare_run() {
  local port t0 rc=0
  port=$(store_port)
  t0=$(date +%s%N)
  FI_PROVIDER=tcp $BNS timeout "$RUN_TIMEOUT" "$BARE" -s -p $port -b 4 -e "$MAXB" -t "$TARGET" \
    >/dev/null 2>"$RAW.$1.err1.tmp" &
  PIDS+=($!)
  FI_PROVIDER=tcp $ANS timeout "$RUN_TIMEOUT" "$BARE" -p $port -b 4 -e "$MAXB" -t "$TARGET" $IPB \
    >"$RAW.$1.tmp" 2>"$RAW.$1.err0.tmp" || rc=$?
  wait $! || true
  log "$(printf 'bare %-16s rc=%-3s %5d ms' "$1" $rc $((($(date +%s%N) - t0) / 1000000)))"
  [ $rc = 0 ] || : >"$RAW.$1.failed.tmp"
}

TRANSPORTS=("tcp:HCOMM_TRANSPORT=tcp" "ofi:HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp")
[ $INTEL = 1 ] && TRANSPORTS+=("ofi24:HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp HCOMM_OFI_LIB=$IV/lib/libfabric.so.1 FI_PROVIDER_PATH=$IV/lib")
for ((round = 1; round <= ROUNDS; round++)); do
  log "# round $round"
  bare_run "bare_pingpong.$round"
  for t in "${TRANSPORTS[@]}"; do
    name=${t%%:*} vars=${t#*:}
    for op in pingpong allreduce; do
      # From 4 B: the first size also absorbs the connections being made (8 B is timed second).
      hcomm_job "${name}_$op.$round" "$vars" "$op" -b 4 -e "$MAXB" -f 2
    done
  done
  if [ $INTEL = 1 ]; then
    intel_run impi "impi.$round" pingpong,allreduce
    intel_run ccl "ccl.$round" allreduce
  fi
done

# best A B: the smaller of two numbers, either possibly empty.
best() {
  if [ -z "$1" ]; then echo "$2"; elif [ -z "$2" ]; then echo "$1"; else awk -v a="$1" -v b="$2" 'BEGIN { print (a < b) ? a : b }'; fi
}

{
  summary_head "hcomm over libfabric tcp vs hcomm TCP, bare libfabric, Intel MPI, oneCCL; netns, $ROUNDS rounds, nice $NICE"
  echo "# total time: $(($(date +%s) - START)) s"
  [ $INTEL = 1 ] && echo "# Intel MPI: $(sed -n 's/^# mpi_bench *library: //p' "$RAW.impi.1.tmp" 2>/dev/null | head -1)"
  echo "# libfabric: $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: *//p' | head -1) (bare, hcomm); Intel's own for Intel MPI and oneCCL"
  echo "# time (us) = median over the rounds (each round: median of its iterations; pingpong: half round trip)"
  echo "# ofi/best = the faster of hcomm ofi and ofi24 / min(Intel MPI, oneCCL): below 1, hcomm over libfabric is faster"
  printf '%-10s %9s %9s %9s %9s %9s %9s %9s %9s\n' op size "bare(us)" "tcp(us)" "ofi(us)" "ofi24(us)" "impi(us)" "ccl(us)" ofi/best
  for op in pingpong allreduce; do
    for s in $SIZES; do
      [ "$s" -le "$MAXB" ] || continue
      bare= ccl=
      [ $op = pingpong ] && bare=$(median bare_pingpong "$s")
      tcp=$(median "tcp_$op" "$s") ofi=$(median "ofi_$op" "$s") ofi24=$(median "ofi24_$op" "$s")
      impi=$(median impi "$s" $op)
      [ $op = allreduce ] && ccl=$(median ccl "$s" allreduce)
      printf '%-10s %9s %9s %9s %9s %9s %9s %9s %9s\n' "$op" "$s" "${bare:--}" "${tcp:-n/a}" "${ofi:-n/a}" \
        "${ofi24:--}" "${impi:-n/a}" "${ccl:--}" "$(ratio "$(best "$ofi" "$ofi24")" "$(best "$impi" "$ccl")")"
    done
  done
  run_log
  failed_runs
  raw_tables "round $ROUNDS:" "bare_pingpong.$ROUNDS" "tcp_pingpong.$ROUNDS" "ofi_pingpong.$ROUNDS" \
    "ofi24_pingpong.$ROUNDS" "impi.$ROUNDS" "tcp_allreduce.$ROUNDS" "ofi_allreduce.$ROUNDS" \
    "ofi24_allreduce.$ROUNDS" "ccl.$ROUNDS"
} >"$SUMMARY"
sed -n '/^op /,/^# run/p' "$SUMMARY" | sed '$d'
teardown
