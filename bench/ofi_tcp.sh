#!/usr/bin/env bash
# ofi_tcp.sh - hcomm over libfabric's tcp provider (HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp) vs
# hcomm's own TCP, between two "hosts" on one machine.
#
# Two network namespaces (hc_oa, hc_ob) joined by a veth pair named hc_oveth at both ends,
# 10.79.0.1/24 and 10.79.0.2/24; rank 0 in hc_oa pinned to CPU 0, rank 1 in hc_ob pinned to
# CPU 1, started by hand (HCOMM_RANK/SIZE, HCOMM_ROOT_ADDR, a random HCOMM_JOB_SECRET).
# hcomm_perf pingpong and allreduce (float32 sum) at every power of two from 8 B to --max,
# once per transport, then a comparison at 8 B, 64 KiB, 1 MiB and 16 MiB (time in us; ratio
# = ofi / tcp, below 1: libfabric faster). Intel MPI and oneCCL are not run by this script.
# The namespaces are removed on exit, also on error or Ctrl-C. Needs root (except --local).
#
# usage: bench/ofi_tcp.sh [--local] [--max SIZE] [--target SECS] [--no-build]
#   --local      no namespaces: both ranks on 127.0.0.1 (quick check, no root needed)
#   --max SIZE   largest message (default 16M; K/M/G = powers of 1024)
#   --target S   seconds of timed iterations per size (default 0.2)
#   --no-build   use the hcomm_perf binary as it is
# Environment: HCOMM_* settings (HCOMM_OFI_EAGER_LIMIT, HCOMM_OFI_WRITE_THRESHOLD, ...) reach
# the ranks; RUN_TIMEOUT (default 300 s) bounds each run.
#
# Output: results/ofi_tcp_summary.txt (--local: results/ofi_tcp_local_summary.txt) with the
# comparison and every raw table; raw files results/ofi_tcp_*.tmp (git-ignored).
set -u
. "$(dirname "$0")/common.sh" || exit 1

LOCAL=0 MAX=16M TARGET=0.2 BUILD=1 MPI=0
while [ $# -gt 0 ]; do
  common_arg "$@"
  shift $ARGN
  shift
done
MAXB=$(to_bytes "$MAX") || exit 2

bench_setup ofi_tcp hc_oa hc_ob hc_oveth 10.79.0.1 10.79.0.2
build_hcomm
command -v fi_info >/dev/null || log "# fi_info not found: is libfabric installed?"
ns_up

TRANSPORTS=("tcp:HCOMM_TRANSPORT=tcp" "ofi:HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp")
for t in "${TRANSPORTS[@]}"; do
  name=${t%%:*} vars=${t#*:}
  for op in pingpong allreduce; do
    hcomm_job "${name}_$op" "$vars" "$op" -b 8 -e "$MAXB" -f 2
    hcomm_notes "${name}_$op"
  done
done

{
  summary_head "hcomm over libfabric tcp vs hcomm TCP, $MODE"
  printf '%-10s %10s %12s %12s %7s\n' op size "tcp(us)" "ofi(us)" ratio
  for op in pingpong allreduce; do
    for s in 8 65536 1048576 16777216; do
      [ "$s" -le "$MAXB" ] || continue
      a=$(hc "tcp_$op" "$s" 6) b=$(hc "ofi_$op" "$s" 6)
      printf '%-10s %10s %12s %12s %7s\n' "$op" "$s" "${a:-n/a}" "${b:-n/a}" "$(ratio "${b:-}" "${a:-}")"
    done
  done
  run_log
  raw_tables hcomm tcp_pingpong tcp_allreduce ofi_pingpong ofi_allreduce
} >"$SUMMARY"
head -16 "$SUMMARY"
teardown
