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
#               HCOMM_JOB_SECRET); every result checked (-c 1)
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
HERE="$(cd "$(dirname "$0")" && pwd)"
SELF="$HERE/$(basename "$0")"
ROOT="$(dirname "$HERE")"
cd "$HERE" || exit 1

LOCAL=0 MAX=16M BIG=256M TARGET=0.2 BUILD=1 MPI=1 DOBIG=1 EXTRA=1
while [ $# -gt 0 ]; do
  case "$1" in
    --local) LOCAL=1 ;;
    --max) MAX=${2:?--max needs a size}; shift ;;
    --big) BIG=${2:?--big needs a size}; shift ;;
    --target) TARGET=${2:?--target needs seconds}; shift ;;
    --no-mpi) MPI=0 ;;
    --no-build) BUILD=0 ;;
    --no-big) DOBIG=0 ;;
    --no-extra) EXTRA=0 ;;
    -h | --help) sed -n '2,/^set -u/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "coll_tcp.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# Bytes of a size with an optional K/M/G suffix (powers of 1024).
to_bytes() {
  local n=${1%[KkMmGg]} mult=1
  case "$1" in *[Kk]) mult=1024 ;; *[Mm]) mult=1048576 ;; *[Gg]) mult=1073741824 ;; esac
  case "$n" in '' | *[!0-9]*) echo "coll_tcp.sh: bad size '$1'" >&2; return 1 ;; esac
  echo $((n * mult))
}
MAXB=$(to_bytes "$MAX") || exit 2
BIGB=$(to_bytes "$BIG") || exit 2
# The mismatch-check runs stop at 1 MiB (or --max when smaller).
MMB=$((MAXB < 1048576 ? MAXB : 1048576))

R=$HERE/results
mkdir -p "$R" "$HERE/build"
if [ $LOCAL = 1 ]; then
  MODE=local SUMMARY=$R/coll_tcp_local_summary.txt
  IPA=127.0.0.1 IPB=127.0.0.1
  ANS="taskset -c 0" BNS="taskset -c 1"
else
  MODE=netns SUMMARY=$R/coll_tcp_summary.txt
  NSA=hcc_a NSB=hcc_b IF=hcc_veth IPA=10.76.0.1 IPB=10.76.0.2
  ANS="ip netns exec $NSA taskset -c 0" BNS="ip netns exec $NSB taskset -c 1"
fi
RAW=$R/coll_tcp_$MODE
LOG=$RAW.log.tmp
rm -f "$RAW".*.tmp "$RAW".*.tmp.failed
: >"$LOG"
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-30}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
PERF=${HCOMM_PERF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/hcomm_perf}
MPIBIN=$HERE/build/mpi_bench_ompi
PIDS=()
START=$(date +%s)

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
  (cd "$ROOT" && cargo build --release -p hcomm-tools) || { echo "coll_tcp.sh: cargo build failed" >&2; exit 1; }
fi
[ -x "$PERF" ] || { echo "coll_tcp.sh: $PERF not found (build it or drop --no-build)" >&2; exit 1; }
"$PERF" allreduce --help >/dev/null 2>&1 || { echo "coll_tcp.sh: $PERF has no collectives (rebuild it)" >&2; exit 1; }
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
  [ "$(id -u)" = 0 ] || { echo "coll_tcp.sh: network namespaces need root (or use --local)" >&2; exit 1; }
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
else
  log "# local: both ranks on 127.0.0.1 (rank 0 CPU 0, rank 1 CPU 1)"
fi

# ---- hcomm ---------------------------------------------------------------------
# hcomm OUTNAME "VAR=VALUE ..." ARGS...: hcomm_perf ARGS with rank 0 in A, rank 1 in B, the
# variables added to both ranks' environment, a fresh port and secret each run.
hcomm() {
  local name=$1 vars=$2; shift 2
  local port=$((30000 + RANDOM % 20000))
  local secret
  secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  local t0=$(date +%s%N)
  HCOMM_RANK=0 HCOMM_SIZE=2 HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
    env $vars $ANS timeout "$RUN_TIMEOUT" "$PERF" "$@" --time-target "$TARGET" \
    -J "$RAW.$name.json.tmp" >"$RAW.$name.tmp" 2>"$RAW.$name.err0.tmp" &
  local p0=$!
  PIDS+=($p0)
  HCOMM_RANK=1 HCOMM_SIZE=2 HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
    env $vars $BNS timeout "$RUN_TIMEOUT" "$PERF" "$@" --time-target "$TARGET" \
    >/dev/null 2>"$RAW.$name.err1.tmp" &
  local p1=$!
  PIDS+=($p1)
  wait $p0; local rc0=$?
  wait $p1; local rc1=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  log "$(printf 'hcomm %-16s %-26s rank0 rc=%-3s rank1 rc=%-3s %5d.%d s' "$name" "${vars:--}" $rc0 $rc1 $((ms / 1000)) $((ms % 1000 / 100)))"
  { [ $rc0 = 124 ] || [ $rc1 = 124 ]; } && log "  killed after RUN_TIMEOUT=$RUN_TIMEOUT s (hang or extreme slowness)"
  cat "$RAW.$name.err0.tmp" "$RAW.$name.err1.tmp" | sed 's/^/  stderr: /' | head -6 | tee -a "$LOG"
  [ $rc0 = 0 ] && [ $rc1 = 0 ] || : >"$RAW.$name.tmp.failed"
}

SWEEP="-b 8 -e $MAXB -f 2"
hcomm allreduce "" allreduce $SWEEP -d float32 -o sum
hcomm broadcast "" broadcast $SWEEP -d float32
hcomm allgather "" allgather $SWEEP -d float32
[ $DOBIG = 1 ] && hcomm allreduce_big "" allreduce -b "$BIGB" -e "$BIGB" -d float32 -o sum
if [ $EXTRA = 1 ]; then
  # Interleaved, two rounds each: the difference is small, so noise matters.
  for round in 1 2; do
    hcomm mm_on$round "" allreduce -b 8 -e "$MMB" -f 2 -d float32 -o sum
    hcomm mm_off$round "HCOMM_MISMATCH_CHECK=0" allreduce -b 8 -e "$MMB" -f 2 -d float32 -o sum
  done
  hcomm determ "HCOMM_DETERMINISTIC=1" allreduce $SWEEP -d float32 -o sum
fi

# ---- Open MPI --------------------------------------------------------------------
# ompi OUTNAME MPI_BENCH_ARGS...
ompi() {
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout "$RUN_TIMEOUT" $OMPI "$MPIBIN" "$@" -t "$TARGET" >"$RAW.$name.tmp" 2>"$RAW.$name.err.tmp"
  local rc=$?
  local ms=$((($(date +%s%N) - t0) / 1000000))
  log "$(printf 'Open MPI %-13s %-26s rc=%-3s %17s %5d.%d s' "$name" "$*" $rc "" $((ms / 1000)) $((ms % 1000 / 100)))"
  [ -s "$RAW.$name.err.tmp" ] && sed 's/^/  stderr: /' "$RAW.$name.err.tmp" | head -5 | tee -a "$LOG"
  [ $rc = 0 ] || : >"$RAW.$name.tmp.failed"
}
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
  ompi ompi -b 8 -e "$MAXB" -o allreduce,bcast,allgather
  [ $DOBIG = 1 ] && ompi ompi_big -s "$BIGB" -o allreduce
fi

cleanup
trap - EXIT

# ---- comparison ------------------------------------------------------------------
# hc NAME SIZE COLUMN: a column of hcomm_perf's row for SIZE in run NAME (6 = time_us,
# 7 = algbw, 8 = busbw, 10 = algorithm).
hc() {
  [ -f "$RAW.$1.tmp" ] && awk -v s="$2" -v c="$3" '!/^#/ && $1 == s { print $c; exit }' "$RAW.$1.tmp"
}
# mpi NAME OP SIZE COLUMN: a column of mpi_bench's row (4 = time_us, 5 = algbw, 6 = busbw).
mpi() {
  [ $MPI = 1 ] && [ -f "$RAW.$1.tmp" ] &&
    awk -v op="$2" -v s="$3" -v c="$4" '/^# op:/ { cur = $3 } !/^#/ && cur == op && $1 == s { print $c; exit }' "$RAW.$1.tmp"
}
# ratio A B: A / B with two decimals, or n/a.
ratio() {
  if [ -n "$1" ] && [ -n "$2" ]; then
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'
  else
    echo n/a
  fi
}
# gbps SIZE TIME_US FACTOR: bus bandwidth in GB/s from the time column (more digits than the
# busbw column).
gbps() { [ -n "$2" ] && awk -v s="$1" -v t="$2" -v f="$3" 'BEGIN { if (t > 0) printf "%.4g", s / t / 1e3 * f }'; }
# verdict RATIO OP LIMIT: "ok" when RATIO OP LIMIT holds (OP: le or ge), "MISSED" otherwise.
verdict() {
  case "$1" in n/a | '') echo "n/a"; return ;; esac
  awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { ok = (op == "le") ? r <= l : r >= l; print ok ? "ok" : "MISSED" }'
}
line() { # line LABEL HCOMM OMPI [TARGET_TEXT VERDICT] [ALGO]
  printf '%-34s %11s %11s %7s  %-14s %-7s %s\n' "$1" "${2:-n/a}" "${3:-n/a}" "$(ratio "$2" "$3")" \
    "${4:-}" "${5:-}" "${6:-}"
}
# coll_rows OP MPIOP FACTOR: time at 8 B, bus bandwidth at 64 KiB, 1 MiB, 16 MiB.
coll_rows() {
  local op=$1 mop=$2 f=$3 t h m
  h=$(hc "$op" 8 6) m=$(mpi ompi "$mop" 8 4)
  if [ "$op" = allreduce ]; then t=$(ratio "$h" "$m"); line "$op 8 B time (us)" "$h" "$m" "<= 1" "$(verdict "$t" le 1)" "$(hc "$op" 8 10)"
  else line "$op 8 B time (us)" "$h" "$m" "" "" "$(hc "$op" 8 10)"; fi
  for s in 65536 1048576 16777216; do
    [ "$s" -le "$MAXB" ] || continue
    h=$(gbps $s "$(hc "$op" $s 6)" "$f") m=$(gbps $s "$(mpi ompi "$mop" $s 4)" "$f")
    if [ "$op" = allreduce ] && [ $s = 16777216 ]; then
      t=$(ratio "$h" "$m"); line "$op $s B busbw (GB/s)" "$h" "$m" ">= 2" "$(verdict "$t" ge 2)" "$(hc "$op" $s 10)"
    else
      line "$op $s B busbw (GB/s)" "$h" "$m" "" "" "$(hc "$op" $s 10)"
    fi
  done
}
# avg2 A B: the mean of two numbers (either may be missing).
avg2() { awk -v a="${1:-}" -v b="${2:-}" 'BEGIN { n = (a != "") + (b != ""); if (n) printf "%.2f", (a + b) / n }'; }
{
  echo "# hcomm vs Open MPI, collectives over TCP ($MODE, 2 ranks), bench/coll_tcp.sh"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  kernel: $(uname -r)  cpus: $(nproc)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "# hcomm: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && [ -n "$(git status --porcelain -- crates 2>/dev/null)" ] && echo ' (+ uncommitted changes in crates/)')"
  [ $MPI = 1 ] && echo "# Open MPI: $(mpirun.openmpi --version 2>/dev/null | head -1)"
  echo "# HCOMM settings: $(env | grep '^HCOMM_' | grep -v '^HCOMM_JOB_SECRET' | sort | tr '\n' ' ')"
  echo "# time target ${TARGET} s per size, sizes 8..$MAXB B (x2), float32; time = median of the"
  echo "# slowest rank (both tools); busbw = size/time x 2(n-1)/n (allreduce), x 1 (broadcast),"
  echo "# x (n-1)/n (allgather); GB/s = 1e9 B/s; allgather size = the whole output (nccl-tests)"
  echo "# total time: $(($(date +%s) - START)) s"
  grep -v '^#' "$LOG" | sed 's/^/# run: /'
  for f in "$RAW".*.tmp.failed; do [ -e "$f" ] && echo "# FAILED: $(basename "${f%.tmp.failed}" | sed "s/^coll_tcp_$MODE\.//")"; done
  echo "#"
  echo "# ratio = hcomm / Open MPI: for time (us) below 1 means hcomm is faster, for bandwidth"
  echo "# (GB/s) above 1 means hcomm is faster; algo = hcomm's algorithm for that size"
  printf '%-34s %11s %11s %7s  %-14s %-7s %s\n' "metric" "hcomm" "Open MPI" "ratio" "target" "verdict" "algo"
  coll_rows allreduce allreduce 1
  if [ $DOBIG = 1 ]; then
    line "allreduce $BIGB B busbw (GB/s)" "$(gbps "$BIGB" "$(hc allreduce_big "$BIGB" 6)" 1)" \
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
  for f in allreduce allreduce_big broadcast allgather mm_on1 mm_off1 mm_on2 mm_off2 determ; do
    [ -f "$RAW.$f.tmp" ] || continue
    echo
    echo "# ---- hcomm_perf $f ----"
    cat "$RAW.$f.tmp" 2>/dev/null
  done
  if [ $MPI = 1 ]; then
    for f in ompi ompi_big; do
      [ -f "$RAW.$f.tmp" ] || continue
      echo
      echo "# ---- Open MPI mpi_bench $f (btl tcp,self) ----"
      cat "$RAW.$f.tmp" 2>/dev/null
    done
  fi
} >"$SUMMARY"
sed -n '/^metric/,/^# ----/p' "$SUMMARY" | sed '$d'
echo "summary: $SUMMARY"
