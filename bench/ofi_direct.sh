#!/usr/bin/env bash
# ofi_direct.sh - hcomm's direct collective steps over libfabric's tcp provider (each step
# written straight into the receive the peer offered, HCOMM_OFI_DIRECT=1, the default) against
# the same build sending collective steps as other messages (HCOMM_OFI_DIRECT=0: RDMA read up
# to 1 MiB, announced RDMA write above), with Intel MPI and oneCCL over the same provider for
# reference, between two "hosts" on one machine, interleaved over several rounds.
#
# The namespaces, pinning and niceness of ofi_tcp.sh, set up by the same functions of
# common.sh (ofi_args, ofi_setup, ns_up, intel_run; hc_da, hc_db joined by hc_dveth,
# 10.80.0.1/24 and 10.80.0.2/24; rank 0 on CPU 0, rank 1 on CPU 1, nice NICE). Per round:
#   direct    hcomm_perf allreduce and allgather, HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp
#   nodirect  the same with HCOMM_OFI_DIRECT=0
#   impi      Intel MPI's mpi_bench allreduce,allgather (I_MPI_FABRICS=ofi FI_PROVIDER=tcp)
#   ccl       oneCCL's ccl_bench allreduce,allgather (CCL_ATL_TRANSPORT=ofi, no shm)
# at 64 KiB, 1 MiB and 16 MiB (allgather: the whole output, as nccl-tests count it).
# The summary has the median over the rounds of each one's time (us) per op and size, and
# direct/nodirect. Needs root.
#
# usage: bench/ofi_direct.sh [--rounds N] [--target SECS] [--no-build] [--no-intel]
# Output: results/ofi_direct_summary.txt; raw files results/ofi_direct_netns.*.tmp.
set -u
. "$(dirname "$0")/common.sh" || exit 1

ofi_args "$@"
SIZES="65536 1048576 16777216"

ofi_setup ofi_direct hc_da hc_db hc_dveth 10.80.0.1 10.80.0.2
ns_up

OFI="HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp"
VARIANTS=("direct:$OFI HCOMM_OFI_DIRECT=1" "nodirect:$OFI HCOMM_OFI_DIRECT=0")
for ((round = 1; round <= ROUNDS; round++)); do
  log "# round $round"
  # From 4 KiB: the first size also absorbs the making of the connections.
  ab_round $round "allreduce allgather" allreduce,allgather -b 4096 -e 16M -f 4
done

{
  summary_head "hcomm direct collective steps over libfabric tcp vs the same without, Intel MPI, oneCCL; netns, $ROUNDS rounds, nice $NICE"
  echo "# total time: $(($(date +%s) - START)) s"
  echo "# time (us) = median over the rounds; direct/nodirect below 1: the direct steps are faster"
  ab_table direct nodirect "allreduce allgather"
  run_log
  failed_runs
  raw_tables "round $ROUNDS:" "direct_allreduce.$ROUNDS" "nodirect_allreduce.$ROUNDS" \
    "direct_allgather.$ROUNDS" "nodirect_allgather.$ROUNDS" "impi.$ROUNDS" "ccl.$ROUNDS"
} >"$SUMMARY"
sed -n '/^op /,/^# run/p' "$SUMMARY" | sed '$d'
teardown
