#!/usr/bin/env bash
# rails.sh - hcomm over one and two rails between two "hosts" on one machine.
#
# Two network namespaces (hr_a, hr_b) joined by two veth pairs, r0 (10.79.0.0/24) and r1
# (10.79.1.0/24); one rank in each, rank 0 in hr_a (store on 10.79.0.1). Measures:
#   1. hcomm_perf stream (point-to-point bandwidth, rank 0 -> rank 1, a window of 2) and
#      allreduce at 1, 16 and 256 MiB with one rail (HCOMM_SOCKET_IFNAME==r0) and with both
#      (the default, which fails over);
#   2. the cost of being ready to fail over on one rail: the same on rail 0 alone with
#      HCOMM_FAILOVER=1 (records, acknowledgements, frames kept) against HCOMM_FAILOVER=0, and
#      pingpong latency at 8 B both ways;
#   3. recovery after a rail loss: hcomm_check rails (checked 64 MiB all-reduces), rail 0 set
#      down after step 2, HCOMM_LINK_TIMEOUT=$LINK_TIMEOUT: the longest step against the
#      median step.
# On this machine veth traffic is CPU-bound (both ranks and the kernel's copies share the
# cores), so a second rail adds streams, not wire bandwidth: read the two-rail numbers as the
# cost or gain of spreading over rails.
#
# usage: bench/rails.sh [--no-build]
# Environment: HCOMM_* settings reach the ranks (HCOMM_TCP_STREAMS ...); ITERS (default 5)
# timed iterations per size; RUN_TIMEOUT (default 300 s) bounds each run; LINK_TIMEOUT
# (default 1) seconds for the recovery run.
# Output: results/rails_summary.txt. Needs root and iproute2.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
BUILD=1
for a in "$@"; do
  case "$a" in
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "rails.sh: unknown argument '$a'" >&2; exit 2 ;;
  esac
done
ITERS=${ITERS:-5}
LINK_TIMEOUT=${LINK_TIMEOUT:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
NSA=hr_a NSB=hr_b
OUT=$HERE/results/rails_summary.txt
mkdir -p "$HERE/results"

if [ $BUILD = 1 ]; then
  (cd "$ROOT" && cargo build --release -q -p hcomm-tools --bin hcomm_perf --bin hcomm_check)
fi
PERF=$ROOT/target/release/hcomm_perf
CHECK=$ROOT/target/release/hcomm_check

cleanup() { ip netns del $NSA 2>/dev/null || true; ip netns del $NSB 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add $NSA
ip netns add $NSB
for ns in $NSA $NSB; do ip -n $ns link set lo up; done
for i in 0 1; do
  ip -n $NSA link add r$i type veth peer name r$i netns $NSB
  ip -n $NSA addr add 10.79.$i.1/24 dev r$i
  ip -n $NSB addr add 10.79.$i.2/24 dev r$i
  ip -n $NSA link set r$i up
  ip -n $NSB link set r$i up
done

# run NAME IFNAME OP ARGS...: one hcomm_perf job, rank 0 in A, rank 1 in B; its table into
# the summary. FAILOVER (if set) becomes HCOMM_FAILOVER.
run() { run_prog "$PERF" "$@"; }

run_prog() {
  local prog=$1 name=$2 ifname=$3; shift 3
  local port=$((20000 + RANDOM % 12000)) secret
  secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local envs=(HCOMM_SIZE=2 HCOMM_ROOT_ADDR=10.79.0.1:$port HCOMM_JOB_SECRET=$secret
    HCOMM_TIMEOUT=60 HCOMM_SOCKET_IFNAME=$ifname ${FAILOVER:+HCOMM_FAILOVER=$FAILOVER}
    HCOMM_LINK_TIMEOUT=$LINK_TIMEOUT)
  local t0=$SECONDS
  ip netns exec $NSA env "${envs[@]}" HCOMM_RANK=0 HCOMM_HOST_ID=a \
    timeout "$RUN_TIMEOUT" "$prog" "$@" >"$HERE/results/rails_$name.tmp" 2>&1 &
  local a=$!
  ip netns exec $NSB env "${envs[@]}" HCOMM_RANK=1 HCOMM_HOST_ID=b \
    timeout "$RUN_TIMEOUT" "$prog" "$@" >/dev/null 2>&1 &
  local b=$!
  local rc=0
  if [ -n "${CUT_AFTER:-}" ]; then
    for _ in $(seq 600); do grep -q "^step $CUT_AFTER " "$HERE/results/rails_$name.tmp" && break; sleep 0.1; done
    ip -n $NSA link set r0 down
  fi
  wait $a || rc=$?
  wait $b || rc=$?
  {
    echo "## $name (HCOMM_SOCKET_IFNAME=$ifname${FAILOVER:+ HCOMM_FAILOVER=$FAILOVER}): $(basename "$prog") $* (rc $rc, $((SECONDS - t0)) s)"
    cat "$HERE/results/rails_$name.tmp"
    echo
  } >>"$OUT"
}

: >"$OUT"
echo "# rails.sh on $(nproc) cores, $(date -u +%FT%TZ), commit $(cd "$ROOT" && git rev-parse --short HEAD)" >>"$OUT"
SIZES=(-b 1M -e 256M -f 16 -n "$ITERS" -w 1)
for rails in 1 2; do
  if [ $rails = 1 ]; then ifname="=r0"; else ifname="r"; fi
  run "stream_${rails}rail" "$ifname" stream --window 2 "${SIZES[@]}"
  run "allreduce_${rails}rail" "$ifname" allreduce "${SIZES[@]}"
done
for f in 0 1; do
  FAILOVER=$f run "stream_1rail_failover$f" "=r0" stream --window 2 "${SIZES[@]}"
  FAILOVER=$f run "allreduce_1rail_failover$f" "=r0" allreduce "${SIZES[@]}"
  FAILOVER=$f run "pingpong_1rail_failover$f" "=r0" pingpong -b 8 -e 8 -n 2000 -w 100
done
CUT_AFTER=2 run_prog "$CHECK" recovery r rails --traffic allreduce --count 12 --bytes 67108864
steps=$(grep '^step ' "$HERE/results/rails_recovery.tmp" | awk 'NR>1 {print ($3-prev)/1000} {prev=$3}' | sort -n)
{
  echo "## recovery: step durations (ms), sorted: $(echo $steps | tr '\n' ' ')"
  echo "median $(echo "$steps" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ms, longest $(echo "$steps" | tail -1) ms, link timeout ${LINK_TIMEOUT} s"
} >>"$OUT"
ip -n $NSA link set r0 up
cat "$OUT"
