#!/usr/bin/env bash
# ofi_eager.sh - hcomm over libfabric's tcp provider with the eager limit at its default
# against the same build with another eager setup (VARIANT_B), with Intel MPI and oneCCL over
# the same provider for reference, between two "hosts" on one machine, interleaved over
# several rounds.
#
# The namespaces, pinning and niceness of ofi_tcp.sh, set up by the same functions of
# common.sh (ofi_args, ofi_setup, ns_up, intel_run; hc_ea, hc_eb joined by hc_eveth,
# 10.81.0.1/24 and 10.81.0.2/24; rank 0 on CPU 0, rank 1 on CPU 1, nice NICE). Per round:
#   a     hcomm_perf pingpong and allreduce, HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp (defaults)
#   b     the same with VARIANT_B's variables (default: FI_OFI_RXM_BUFFER_SIZE=66560
#         HCOMM_OFI_EAGER_LIMIT=65536: eager, in one rxm buffer, up to 64 KiB)
#   impi  Intel MPI's mpi_bench pingpong,allreduce (I_MPI_FABRICS=ofi FI_PROVIDER=tcp)
#   ccl   oneCCL's ccl_bench pingpong,allreduce (CCL_ATL_TRANSPORT=ofi, no shm)
# With --intel-lib, one more hcomm variant on Intel's libfabric (2.4, the one Intel MPI and
# oneCCL load), in the same turns:
#   c     a's settings with HCOMM_OFI_LIB=$INTEL_VENV/lib/libfabric.so.1: FI_PROVIDER=tcp is
#         2.4's native tcp RDM endpoint (xnet, no ofi_rxm), the one Intel MPI takes. (2.4 offers
#         no "tcp;ofi_rxm" chain: fi_getinfo answers -FI_ENODATA for it, so the layering of
#         Debian's 1.17 cannot be had from that library.)
# at 8 B, 16 KiB, 64 KiB and 1 MiB. The summary has the median over the rounds of each one's
# time (us) per op and size, and b/a (with --intel-lib also c/a and c/impi). Needs root.
#
# usage: bench/ofi_eager.sh [--rounds N] [--target SECS] [--no-build] [--no-intel] [--intel-lib]
# Output: results/ofi_eager_summary.txt; raw files results/ofi_eager_netns.*.tmp.
set -u
. "$(dirname "$0")/common.sh" || exit 1

ARGS=() LIB24=0
for arg in "$@"; do
  if [ "$arg" = --intel-lib ]; then LIB24=1; else ARGS+=("$arg"); fi
done
ofi_args --max 1M "${ARGS[@]}"
SIZES="8 16384 65536 1048576"
VARIANT_B=${VARIANT_B:-FI_OFI_RXM_BUFFER_SIZE=66560 HCOMM_OFI_EAGER_LIMIT=65536}

ofi_setup ofi_eager hc_ea hc_eb hc_eveth 10.81.0.1 10.81.0.2
ns_up

OFI="HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp"
VARIANTS=("a:$OFI" "b:$OFI $VARIANT_B")
if [ $LIB24 = 1 ]; then
  [ -e "$IV/lib/libfabric.so.1" ] || { echo "$NAME: --intel-lib: no $IV/lib/libfabric.so.1 (bench/intel/setup.sh)" >&2; exit 1; }
  LIB="HCOMM_OFI_LIB=$IV/lib/libfabric.so.1 FI_PROVIDER_PATH=$IV/lib"
  VARIANTS+=("c:$OFI $LIB")
fi
for ((round = 1; round <= ROUNDS; round++)); do
  log "# round $round"
  # From 4 B: the first size also absorbs the making of the connections.
  ab_round $round "pingpong allreduce" pingpong,allreduce -b 4 -e "$MAXB" -f 2
done

{
  summary_head "hcomm over libfabric tcp, eager defaults (a) vs $VARIANT_B (b), Intel MPI, oneCCL; netns, $ROUNDS rounds, nice $NICE"
  echo "# total time: $(($(date +%s) - START)) s"
  echo "# time (us) = median over the rounds; b/a below 1: b is faster"
  ab_table b a "pingpong allreduce"
  if [ $LIB24 = 1 ]; then
    echo "# c: hcomm on Intel's libfabric ($IV/lib/libfabric.so.1), FI_PROVIDER=tcp"
    printf '%-10s %9s %9s %9s %9s %9s %9s\n' op size "a(us)" "c(us)" "impi(us)" c/a c/impi
    for op in pingpong allreduce; do
      for s in $SIZES; do
        x=$(median "a_$op" "$s") c=$(median "c_$op" "$s") impi=$(median impi "$s" "$op")
        printf '%-10s %9s %9s %9s %9s %9s %9s\n' "$op" "$s" "${x:-n/a}" "${c:-n/a}" "${impi:-n/a}" \
          "$(ratio "$c" "$x")" "$(ratio "$c" "$impi")"
      done
    done
  fi
  run_log
  failed_runs
  raw_tables "round $ROUNDS:" "a_pingpong.$ROUNDS" "b_pingpong.$ROUNDS" "c_pingpong.$ROUNDS" \
    "a_allreduce.$ROUNDS" "b_allreduce.$ROUNDS" "c_allreduce.$ROUNDS" "impi.$ROUNDS" "ccl.$ROUNDS"
} >"$SUMMARY"
sed -n '/^op /,/^# run/p' "$SUMMARY" | sed '$d'
teardown
