#!/usr/bin/env bash
# p2p_tcp.sh - hcomm vs Open MPI, point-to-point over TCP between two "hosts" on one machine.
#
# Two network namespaces (hc_a, hc_b) joined by a veth pair named hc_veth at both ends;
# 10.78.0.1/24 and 10.78.0.2/24 exist only inside them, so all traffic stays on the veth.
# Rank 0 runs in hc_a pinned to CPU 0, rank 1 in hc_b pinned to CPU 1.
#   * hcomm:    hcomm_perf pingpong and stream, ranks started by hand (HCOMM_RANK/SIZE,
#               HCOMM_ROOT_ADDR=10.78.0.1:<random port>, a random HCOMM_JOB_SECRET)
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
HERE="$(cd "$(dirname "$0")" && pwd)"
SELF="$HERE/$(basename "$0")"
ROOT="$(dirname "$HERE")"
cd "$HERE" || exit 1

LOCAL=0 MAX=16M TARGET=0.2 BUILD=1 MPI=1 SPIN=1
SPIN_US=${SPIN_US:-1000000}
while [ $# -gt 0 ]; do
  case "$1" in
    --local) LOCAL=1 ;;
    --max) MAX=${2:?--max needs a size}; shift ;;
    --target) TARGET=${2:?--target needs seconds}; shift ;;
    --no-mpi) MPI=0 ;;
    --no-build) BUILD=0 ;;
    --no-spin) SPIN=0 ;;
    -h | --help) sed -n '2,/^set -u/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "p2p_tcp.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Bytes of a size with an optional K/M/G suffix (powers of 1024).
to_bytes() {
  local n=${1%[KkMmGg]} mult=1
  case "$1" in *[Kk]) mult=1024 ;; *[Mm]) mult=1048576 ;; *[Gg]) mult=1073741824 ;; esac
  case "$n" in '' | *[!0-9]*) echo "p2p_tcp.sh: bad size '$1'" >&2; return 1 ;; esac
  echo $((n * mult))
}
MAXB=$(to_bytes "$MAX") || exit 2

R=$HERE/results
mkdir -p "$R" "$HERE/build"
if [ $LOCAL = 1 ]; then
  MODE=local SUMMARY=$R/p2p_tcp_local_summary.txt
  IPA=127.0.0.1 IPB=127.0.0.1
  ANS="taskset -c 0" BNS="taskset -c 1"
else
  MODE=netns SUMMARY=$R/p2p_tcp_summary.txt
  NSA=hc_a NSB=hc_b IF=hc_veth IPA=10.78.0.1 IPB=10.78.0.2
  ANS="ip netns exec $NSA taskset -c 0" BNS="ip netns exec $NSB taskset -c 1"
fi
RAW=$R/p2p_tcp_$MODE
LOG=$RAW.log.tmp
rm -f "$RAW".*.tmp
: >"$LOG"
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-30}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
FALLBACK_WINDOW=${FALLBACK_WINDOW:-8}
PERF=${HCOMM_PERF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/hcomm_perf}
MPIBIN=$HERE/build/mpi_bench_ompi
PIDS=()

log() { echo "$*" | tee -a "$LOG"; }

cleanup() {
  local p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null; done
  if [ $LOCAL = 0 ]; then
    ip netns del $NSA 2>/dev/null
    ip netns del $NSB 2>/dev/null
  fi
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- build ---------------------------------------------------------------------
if [ $BUILD = 1 ]; then
  (cd "$ROOT" && cargo build --release -p hcomm-tools) || { echo "p2p_tcp.sh: cargo build failed" >&2; exit 1; }
fi
[ -x "$PERF" ] || { echo "p2p_tcp.sh: $PERF not found (build it or drop --no-build)" >&2; exit 1; }
if [ $MPI = 1 ]; then
  if ! command -v mpirun.openmpi >/dev/null || ! command -v mpicc.openmpi >/dev/null; then
    log "Open MPI (mpirun.openmpi, mpicc.openmpi) not installed: skipped"
    MPI=0
  elif [ ! -x "$MPIBIN" ] || [ "$HERE/mpi_bench.c" -nt "$MPIBIN" ]; then
    mpicc.openmpi -O2 -Wall mpi_bench.c -o "$MPIBIN" || exit 1
  fi
fi

# ---- namespaces ------------------------------------------------------------------
if [ $LOCAL = 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "p2p_tcp.sh: network namespaces need root (or use --local)" >&2; exit 1; }
  cleanup # stale ones from an interrupted run
  ip netns add $NSA && ip netns add $NSB || { log "cannot create network namespaces"; exit 1; }
  ip link add $IF netns $NSA type veth peer name $IF netns $NSB || exit 1
  ip -n $NSA addr add $IPA/24 dev $IF
  ip -n $NSB addr add $IPB/24 dev $IF
  for ns in $NSA $NSB; do
    ip -n $ns link set lo up
    ip -n $ns link set $IF up
  done
  log "# namespaces: $NSA ($IPA on $IF, CPU 0) <-> $NSB ($IPB on $IF, CPU 1), veth mtu $(ip -n $NSA -o link show $IF | sed -n 's/.*mtu \([0-9]*\).*/\1/p')"
  log "# routes in $NSA: $(ip -n $NSA route | tr '\n' ';')"
else
  log "# local: both ranks on 127.0.0.1 (rank 0 CPU 0, rank 1 CPU 1)"
fi

# ---- hcomm ---------------------------------------------------------------------
# hcomm OUTNAME OP ARGS...: rank 0 in A, rank 1 in B, fresh port and secret each run.
hcomm() {
  local name=$1; shift
  local port=$((30000 + RANDOM % 20000))
  local secret
  secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local t0=$(date +%s%N)
  HCOMM_RANK=0 HCOMM_SIZE=2 HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
    env $VARIANT_ENV $ANS timeout "$RUN_TIMEOUT" "$PERF" "$@" -b 8 -e "$MAXB" --time-target "$TARGET" \
    -J "$RAW.$name.json.tmp" >"$RAW.$name.tmp" 2>"$RAW.$name.err0.tmp" &
  local p0=$!
  PIDS+=($p0)
  HCOMM_RANK=1 HCOMM_SIZE=2 HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
    env $VARIANT_ENV $BNS timeout "$RUN_TIMEOUT" "$PERF" "$@" -b 8 -e "$MAXB" --time-target "$TARGET" \
    >/dev/null 2>"$RAW.$name.err1.tmp" &
  local p1=$!
  PIDS+=($p1)
  wait $p0; local rc0=$?
  wait $p1; local rc1=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  log "$(printf 'hcomm %-22s %-22s rank0 rc=%-3s rank1 rc=%-3s %4d.%d s' "$name" "$VARIANT_ENV" $rc0 $rc1 $((ms / 1000)) $((ms % 1000 / 100)))"
  [ $rc0 = 124 ] || [ $rc1 = 124 ] && log "  killed after RUN_TIMEOUT=$RUN_TIMEOUT s (hang or extreme slowness)"
  cat "$RAW.$name.err0.tmp" "$RAW.$name.err1.tmp" | sed 's/^/  stderr: /' | head -6 | tee -a "$LOG"
  [ $rc0 = 0 ] && [ $rc1 = 0 ]
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
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  if [ $LOCAL = 0 ]; then
    export P2P_NS_A=$NSA P2P_IP_A=$IPA P2P_CPU_A=0 P2P_NS_B=$NSB P2P_IP_B=$IPB P2P_CPU_B=1
    OMPI="$ANS mpirun.openmpi --allow-run-as-root -np 2 --host $IPA:1,$IPB:1
      --mca plm rsh --mca plm_rsh_agent $HERE/netns_rsh.sh
      --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include $IF --mca oob_tcp_if_include $IF
      --bind-to none"
  else
    OMPI="mpirun.openmpi --allow-run-as-root -np 2 --mca pml ob1 --mca btl tcp,self
      --mca btl_tcp_if_include lo --bind-to core"
  fi
  t0=$(date +%s%N)
  timeout "$RUN_TIMEOUT" $OMPI "$MPIBIN" -b 8 -e "$MAXB" -o pingpong,stream -t "$TARGET" \
    >"$RAW.ompi.tmp" 2>"$RAW.ompi.err.tmp"
  rc=$?
  ms=$((($(date +%s%N) - t0) / 1000000))
  log "$(printf 'Open MPI pingpong,stream     rc=%-3s %4d.%d s' $rc $((ms / 1000)) $((ms % 1000 / 100)))"
  [ -s "$RAW.ompi.err.tmp" ] && sed 's/^/  stderr: /' "$RAW.ompi.err.tmp" | head -5 | tee -a "$LOG"
  [ $rc = 0 ] || : >"$RAW.ompi.tmp.failed"
fi

cleanup
trap - EXIT

# ---- comparison ------------------------------------------------------------------
# hc FILE SIZE COLUMN: a column of hcomm_perf's row for SIZE (6 = time_us, 7 = algbw).
hc() { [ -f "$1" ] && awk -v s="$2" -v c="$3" '!/^#/ && $1 == s { print $c; exit }' "$1"; }
# mpi OP SIZE COLUMN: a column of mpi_bench's row (4 = time_us, 5 = algbw).
mpi() {
  [ $MPI = 1 ] && [ -f "$RAW.ompi.tmp" ] &&
    awk -v op="$1" -v s="$2" -v c="$3" '/^# op:/ { cur = $3 } !/^#/ && cur == op && $1 == s { print $c; exit }' "$RAW.ompi.tmp"
}
# ratio A B: A / B with two decimals, or n/a.
ratio() {
  if [ -n "$1" ] && [ -n "$2" ]; then
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
  else
    echo n/a
  fi
}
# gbps SIZE TIME_US: bandwidth in GB/s from the time column (more digits than algbw).
gbps() { [ -n "$2" ] && awk -v s="$1" -v t="$2" 'BEGIN { if (t > 0) printf "%.4g", s / t / 1e3 }'; }
line() { # line LABEL HCOMM HCOMM_SPIN OMPI
  printf '%-31s %10s %10s %10s %10s %10s\n' "$1" "${2:-n/a}" "${3:-n/a}" "${4:-n/a}" \
    "$(ratio "$2" "$4")" "$(ratio "$3" "$4")"
}
{
  echo "# hcomm vs Open MPI, point-to-point over TCP ($MODE), bench/p2p_tcp.sh"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  kernel: $(uname -r)  cpus: $(nproc)"
  echo "# cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "# hcomm: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && [ -n "$(git status --porcelain -- crates 2>/dev/null)" ] && echo ' (+ uncommitted changes in crates/)')"
  [ $MPI = 1 ] && echo "# Open MPI: $(mpirun.openmpi --version 2>/dev/null | head -1)"
  echo "# HCOMM settings: $(env | grep '^HCOMM_' | grep -v '^HCOMM_JOB_SECRET' | sort | tr '\n' ' ')"
  echo "# time target ${TARGET} s per size, sizes 8..$MAXB B; time = median (pingpong: half round trip;"
  echo "# stream: per message, window 64 capped at 8 MiB in flight); GB/s = 1e9 B/s"
  grep -v '^#' "$LOG" | sed 's/^/# run: /'
  for n in ${NOTES[@]+"${NOTES[@]}"}; do echo "# NOTE: $n"; done
  echo "#"
  echo "# hcomm = defaults; spin = HCOMM_SPIN_US=$SPIN_US; ratio = hcomm / Open MPI: for latency (us)"
  echo "# below 1 means hcomm is faster, for bandwidth (GB/s) above 1 means hcomm is faster"
  printf '%-31s %10s %10s %10s %10s %10s\n' "metric" "hcomm" "spin" "Open MPI" "ratio" "spin ratio"
  for s in 8 65536 1048576 16777216; do
    line "pingpong $s B half-RTT (us)" "$(hc "$RAW.pingpong.tmp" $s 6)" \
      "$(hc "$RAW.spin_pingpong.tmp" $s 6)" "$(mpi pingpong $s 4)"
  done
  for s in 8 65536 1048576 16777216; do
    line "stream $s B (GB/s)" "$(gbps $s "$(hc "$RAW.${STREAMF[default]}.tmp" $s 6)")" \
      "$(gbps $s "$(hc "$RAW.${STREAMF[spin]:-none}.tmp" $s 6)")" "$(gbps $s "$(mpi stream $s 4)")"
  done
  for f in pingpong "${STREAMF[default]}" spin_pingpong ${STREAMF[spin]:-}; do
    [ -f "$RAW.$f.tmp" ] || continue
    echo
    echo "# ---- hcomm_perf $f$(case $f in spin_*) echo " (HCOMM_SPIN_US=$SPIN_US)" ;; esac) ----"
    cat "$RAW.$f.tmp" 2>/dev/null
  done
  if [ $MPI = 1 ]; then
    echo
    echo "# ---- Open MPI mpi_bench (btl tcp,self) ----"
    cat "$RAW.ompi.tmp" 2>/dev/null
  fi
} >"$SUMMARY"
sed -n '/^metric/,/^$/p' "$SUMMARY"
echo "summary: $SUMMARY"
