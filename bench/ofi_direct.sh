#!/usr/bin/env bash
# ofi_direct.sh - hcomm's direct collective steps over libfabric's tcp provider (each step
# written straight into the receive the peer offered, HCOMM_OFI_DIRECT=1, off by default) against
# the same build sending collective steps as other messages (HCOMM_OFI_DIRECT=0: RDMA read up
# to 1 MiB, announced RDMA write above), with Intel MPI and oneCCL over the same provider for
# reference, between two "hosts" on one machine, interleaved over several rounds.
#
# The namespaces, pinning and niceness of ofi_tcp.sh (hc_da, hc_db joined by hc_dveth,
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

LOCAL=0 MAX=16M TARGET=0.2 BUILD=1 MPI=0 ROUNDS=3 INTEL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2; continue ;;
    --no-intel) INTEL=0; shift; continue ;;
  esac
  common_arg "$@"
  shift $ARGN
  shift
done
SIZES="65536 1048576 16777216"
NICE=${NICE:--20}

bench_setup ofi_direct hc_da hc_db hc_dveth 10.80.0.1 10.80.0.2
ANS="ip netns exec $NSA nice -n $NICE taskset -c 0" BNS="ip netns exec $NSB nice -n $NICE taskset -c 1"
build_hcomm
IV=${INTEL_VENV:-/opt/hcomm-peers/intel}
if [ $INTEL = 1 ] && { [ ! -x "$IV/hcomm-bench/mpi_bench_impi" ] || [ ! -x "$IV/hcomm-bench/ccl_bench" ]; }; then
  log "# Intel MPI / oneCCL not found in $IV (bench/intel/setup.sh): skipped"
  INTEL=0
fi
ns_up

# intel_run PEER OUTNAME: mpi_bench (impi) or ccl_bench (ccl), allreduce and allgather at SIZES,
# as in ofi_tcp.sh.
intel_run() {
  local peer=$1 name=$2 t0 rc=0 sizes
  sizes=$(echo $SIZES | tr ' ' ,)
  local args="-s $sizes -t $TARGET -o allreduce,allgather"
  export P2P_NS_A=$NSA P2P_IP_A=$IPA P2P_CPU_A=0 P2P_NS_B=$NSB P2P_IP_B=$IPB P2P_CPU_B=1
  t0=$(date +%s%N)
  (
    . "$HERE/intel/env.sh"
    unset FI_TCP_IFACE
    hyd="mpirun -bootstrap ssh -bootstrap-exec $HERE/netns_rsh.sh -iface $IF -genv I_MPI_FABRICS=ofi -genv FI_PROVIDER=tcp"
    if [ "$peer" = impi ]; then
      timeout "$RUN_TIMEOUT" $ANS $hyd -np 2 -ppn 1 -hosts $IPA,$IPB "$IV/hcomm-bench/mpi_bench_impi" $args
    else
      P="$IV/hcomm-bench/ccl_bench $args"
      timeout "$RUN_TIMEOUT" $ANS $hyd -genv CCL_ATL_TRANSPORT=ofi -genv CCL_ATL_SHM=0 -genv CCL_MNIC_NAME=$IF \
        -n 1 -host $IPA -env CCL_KVS_IFACE $IF $P : -n 1 -host $IPB -env CCL_KVS_IFACE $IF $P
    fi
  ) >"$RAW.$name.tmp" 2>"$RAW.$name.err.tmp" || rc=$?
  log "$(printf '%-4s %-16s rc=%-3s %5d ms' "$peer" "$name" $rc $((($(date +%s%N) - t0) / 1000000)))"
  [ $rc = 0 ] || { : >"$RAW.$name.failed.tmp"; sed 's/^/  stderr: /' "$RAW.$name.err.tmp" | head -5 | tee -a "$LOG"; }
}

OFI="HCOMM_TRANSPORT=ofi FI_PROVIDER=tcp"
VARIANTS=("direct:$OFI HCOMM_OFI_DIRECT=1" "nodirect:$OFI HCOMM_OFI_DIRECT=0")
for ((round = 1; round <= ROUNDS; round++)); do
  log "# round $round"
  # The two variants in turns, the first one alternating between rounds.
  order=(0 1)
  [ $((round % 2)) = 0 ] && order=(1 0)
  for op in allreduce allgather; do
    for i in "${order[@]}"; do
      t=${VARIANTS[$i]}
      # From 4 KiB: the first size also absorbs the making of the connections.
      hcomm_job "${t%%:*}_$op.$round" "${t#*:}" "$op" -b 4096 -e 16M -f 4
    done
  done
  if [ $INTEL = 1 ]; then
    intel_run impi "impi.$round"
    intel_run ccl "ccl.$round"
  fi
done

# time_of NAME SIZE [OP]: the time (us) of SIZE in raw table NAME.
time_of() {
  [ -f "$RAW.$1.tmp" ] && [ ! -e "$RAW.$1.failed.tmp" ] || return 0
  case $1 in
    impi* | ccl*) awk -v op="$3" -v s="$2" '/^# op:/ { cur = $3 } !/^#/ && cur == op && $1 == s { print $4; exit }' "$RAW.$1.tmp" ;;
    *) hc "$1" "$2" 6 ;;
  esac
}
# median NAME SIZE [OP]: the median over the rounds of time_of.
median() {
  local r
  for ((r = 1; r <= ROUNDS; r++)); do time_of "$1.$r" "$2" "${3:-}"; done |
    sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

{
  summary_head "hcomm direct collective steps over libfabric tcp vs the same without, Intel MPI, oneCCL; netns, $ROUNDS rounds, nice $NICE"
  echo "# total time: $(($(date +%s) - START)) s"
  echo "# time (us) = median over the rounds; direct/nodirect below 1: the direct steps are faster"
  printf '%-10s %9s %12s %12s %9s %9s %16s\n' op size "direct(us)" "nodirect(us)" "impi(us)" "ccl(us)" direct/nodirect
  for op in allreduce allgather; do
    for s in $SIZES; do
      d=$(median "direct_$op" "$s") n=$(median "nodirect_$op" "$s")
      impi=$(median impi "$s" $op) ccl=$(median ccl "$s" $op)
      printf '%-10s %9s %12s %12s %9s %9s %16s\n' "$op" "$s" "${d:-n/a}" "${n:-n/a}" "${impi:-n/a}" \
        "${ccl:-n/a}" "$(ratio "$d" "$n")"
    done
  done
  run_log
  failed_runs
  raw_tables "round $ROUNDS:" "direct_allreduce.$ROUNDS" "nodirect_allreduce.$ROUNDS" \
    "direct_allgather.$ROUNDS" "nodirect_allgather.$ROUNDS" "impi.$ROUNDS" "ccl.$ROUNDS"
} >"$SUMMARY"
sed -n '/^op /,/^# run/p' "$SUMMARY" | sed '$d'
teardown
