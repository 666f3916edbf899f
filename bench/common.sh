# common.sh - pieces shared by p2p_tcp.sh and coll_tcp.sh; sourced, not run.
#
# Sourcing sets HERE (this folder), SELF (the script), ROOT (the repository), NAME (the
# script's file name, for messages) and changes into HERE. The functions read the settings
# the scripts keep in globals: LOCAL, MPI, BUILD, TARGET, MAXB, RAW, LOG, IPA, IPB, NSA, NSB,
# IF, ANS, BNS, PERF, MPIBIN, RUN_TIMEOUT, PIDS.
HERE="$(cd "$(dirname "$0")" && pwd)"
SELF="$HERE/$(basename "$0")"
ROOT="$(dirname "$HERE")"
NAME="$(basename "$0")"
cd "$HERE" || exit 1

# ---- arguments -------------------------------------------------------------------
# common_arg "$@": the options both scripts take (--local, --max, --target, --no-mpi,
# --no-build, -h/--help; anything else is an error). Returns how many values it took after
# the option (0 or 1), for the caller to shift.
common_arg() {
  case "$1" in
    --local) LOCAL=1 ;;
    --max) MAX=${2:?--max needs a size}; return 1 ;;
    --target) TARGET=${2:?--target needs seconds}; return 1 ;;
    --no-mpi) MPI=0 ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,/^set -u/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$NAME: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  return 0
}

# Bytes of a size with an optional K/M/G suffix (powers of 1024).
to_bytes() {
  local n=${1%[KkMmGg]} mult=1
  case "$1" in *[Kk]) mult=1024 ;; *[Mm]) mult=1048576 ;; *[Gg]) mult=1073741824 ;; esac
  case "$n" in '' | *[!0-9]*) echo "$NAME: bad size '$1'" >&2; return 1 ;; esac
  echo $((n * mult))
}

# ---- setup -----------------------------------------------------------------------
# bench_setup PREFIX NS_A NS_B VETH IP_A IP_B: the results folder, the mode (local: both
# ranks on 127.0.0.1; netns: rank 0 in NS_A at IP_A, rank 1 in NS_B at IP_B, joined by a
# veth pair named VETH at both ends; rank 0 on CPU 0, rank 1 on CPU 1), SUMMARY
# (results/PREFIX_summary.txt, --local: results/PREFIX_local_summary.txt), the raw files
# results/PREFIX_MODE.*.tmp (old ones removed, LOG emptied), the run settings, and the traps
# that kill the ranks and remove the namespaces on every exit.
bench_setup() {
  local prefix=$1
  R=$HERE/results
  mkdir -p "$R" "$HERE/build"
  if [ $LOCAL = 1 ]; then
    MODE=local SUMMARY=$R/${prefix}_local_summary.txt
    IPA=127.0.0.1 IPB=127.0.0.1
    ANS="taskset -c 0" BNS="taskset -c 1"
  else
    MODE=netns SUMMARY=$R/${prefix}_summary.txt
    NSA=$2 NSB=$3 IF=$4 IPA=$5 IPB=$6
    ANS="ip netns exec $NSA taskset -c 0" BNS="ip netns exec $NSB taskset -c 1"
  fi
  RAW=$R/${prefix}_$MODE
  LOG=$RAW.log.tmp
  rm -f "$RAW".*.tmp
  : >"$LOG"
  export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-30}
  RUN_TIMEOUT=${RUN_TIMEOUT:-300}
  PERF=${HCOMM_PERF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/hcomm_perf}
  MPIBIN=$HERE/build/mpi_bench_ompi
  PIDS=()
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

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

# teardown: after the last run, kill what is left and remove the namespaces.
teardown() {
  cleanup
  trap - EXIT
}

# ---- build -----------------------------------------------------------------------
# build_hcomm: cargo build (unless --no-build) and check that hcomm_perf is there.
build_hcomm() {
  if [ $BUILD = 1 ]; then
    (cd "$ROOT" && cargo build --release -p hcomm-tools) || { echo "$NAME: cargo build failed" >&2; exit 1; }
  fi
  [ -x "$PERF" ] || { echo "$NAME: $PERF not found (build it or drop --no-build)" >&2; exit 1; }
}

# build_mpi: with Open MPI, compile mpi_bench when missing or older than mpi_bench.c;
# without it, MPI=0.
build_mpi() {
  if [ $MPI = 1 ]; then
    if ! command -v mpirun.openmpi >/dev/null || ! command -v mpicc.openmpi >/dev/null; then
      log "Open MPI (mpirun.openmpi, mpicc.openmpi) not installed: skipped"
      MPI=0
    elif [ ! -x "$MPIBIN" ] || [ "$HERE/mpi_bench.c" -nt "$MPIBIN" ]; then
      mpicc.openmpi -O2 -Wall mpi_bench.c -o "$MPIBIN" || exit 1
    fi
  fi
}

# ---- namespaces ------------------------------------------------------------------
# ns_up: create the two namespaces and the veth pair (netns mode; needs root), or say that
# both ranks run on loopback.
ns_up() {
  local ns
  if [ $LOCAL = 0 ]; then
    [ "$(id -u)" = 0 ] || { echo "$NAME: network namespaces need root (or use --local)" >&2; exit 1; }
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
}

# ---- hcomm -----------------------------------------------------------------------
# hcomm_ranks OUTNAME "VAR=VALUE ..." ARGS...: hcomm_perf ARGS --time-target TARGET with
# rank 0 in A (table to RAW.OUTNAME.tmp, JSON to RAW.OUTNAME.json.tmp), rank 1 in B, the
# variables added to both ranks' environment, a fresh port and secret each run. Sets
# RUN_RC0, RUN_RC1 (the ranks' exit codes) and RUN_MS (milliseconds); the caller logs them
# and then calls hcomm_notes.
hcomm_ranks() {
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
  wait $p0; RUN_RC0=$?
  wait $p1; RUN_RC1=$?
  RUN_MS=$((($(date +%s%N) - t0) / 1000000))
}

# hcomm_notes OUTNAME: after hcomm_ranks, log a timeout and the first lines of the ranks'
# error output.
hcomm_notes() {
  { [ $RUN_RC0 = 124 ] || [ $RUN_RC1 = 124 ]; } && log "  killed after RUN_TIMEOUT=$RUN_TIMEOUT s (hang or extreme slowness)"
  cat "$RAW.$1.err0.tmp" "$RAW.$1.err1.tmp" | sed 's/^/  stderr: /' | head -6 | tee -a "$LOG"
}

# ---- Open MPI --------------------------------------------------------------------
# ompi_setup: the mpirun command line in OMPI (netns: launched in A, rank 1 started in B
# through netns_rsh.sh, TCP restricted to the veth; local: loopback, bound to cores).
ompi_setup() {
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
}

# ompi_run OUTNAME MPI_BENCH_ARGS...: mpi_bench ARGS -t TARGET through $OMPI, table to
# RAW.OUTNAME.tmp. Sets RUN_RC and RUN_MS; the caller logs them and then calls ompi_notes.
ompi_run() {
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout "$RUN_TIMEOUT" $OMPI "$MPIBIN" "$@" -t "$TARGET" >"$RAW.$name.tmp" 2>"$RAW.$name.err.tmp"
  RUN_RC=$?
  RUN_MS=$((($(date +%s%N) - t0) / 1000000))
}

# ompi_notes OUTNAME: after ompi_run, log the first lines of the error output; a failed run
# leaves RAW.OUTNAME.tmp.failed.
ompi_notes() {
  [ -s "$RAW.$1.err.tmp" ] && sed 's/^/  stderr: /' "$RAW.$1.err.tmp" | head -5 | tee -a "$LOG"
  [ $RUN_RC = 0 ] || : >"$RAW.$1.tmp.failed"
}

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
# gbps SIZE TIME_US [FACTOR]: bandwidth in GB/s from the time column (more digits than the
# algbw/busbw columns), times FACTOR (default 1: algbw).
gbps() { [ -n "$2" ] && awk -v s="$1" -v t="$2" -v f="${3:-1}" 'BEGIN { if (t > 0) printf "%.4g", s / t / 1e3 * f }'; }

# summary_head TITLE [DATE_LINE_EXTRA]: the summary's first lines (title, machine, hcomm
# commit, Open MPI version, HCOMM_* settings).
summary_head() {
  echo "# $1"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  kernel: $(uname -r)  cpus: $(nproc)${2:-}"
  echo "# cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
  echo "# hcomm: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?')$(cd "$ROOT" && [ -n "$(git status --porcelain -- crates 2>/dev/null)" ] && echo ' (+ uncommitted changes in crates/)')"
  [ $MPI = 1 ] && echo "# Open MPI: $(mpirun.openmpi --version 2>/dev/null | head -1)"
  echo "# HCOMM settings: $(env | grep '^HCOMM_' | grep -v '^HCOMM_JOB_SECRET' | sort | tr '\n' ' ')"
}

# run_log: the log's run lines (not its # lines) for the summary.
run_log() { grep -v '^#' "$LOG" | sed 's/^/# run: /'; }
