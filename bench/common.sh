# common.sh - pieces shared by the benchmark scripts (p2p_tcp.sh, coll_tcp.sh, shm.sh, ofi_tcp.sh,
# ofi_direct.sh, ...); sourced, not run.
#
# Sourcing sets HERE (this folder), SELF (the script), ROOT (the repository), NAME (the
# script's file name, for messages) and changes into HERE. The functions read the settings
# the scripts keep in globals: LOCAL, MPI, BUILD, TARGET, MAXB, RAW, LOG, IPA, IPB, NSA, NSB,
# IF, ANS, BNS, NP, PIN, PERF, MPIBIN, OMPI, RUN_TIMEOUT, PIDS.
#
# Every function works both in scripts with `set -u` and in scripts with
# `set -euo pipefail`: the ones that may find nothing (hc, mpi, gbps, ...) print nothing and
# still return 0, and the exit codes of runs are kept in RUN_RC* instead of being returned.
HERE="$(cd "$(dirname "$0")" && pwd)"
SELF="$HERE/$(basename "$0")"
ROOT="$(dirname "$HERE")"
NAME="$(basename "$0")"
cd "$HERE" || exit 1

# ---- arguments -------------------------------------------------------------------
# common_arg "$@": the options every script takes (--local, --max, --target, --no-mpi,
# --no-build, -h/--help; anything else is an error). Sets ARGN to how many values it took
# after the option (0 or 1), for the caller to `shift $ARGN`.
common_arg() {
  ARGN=0
  case "$1" in
    --local) LOCAL=1 ;;
    --max) MAX=${2:?--max needs a size}; ARGN=1 ;;
    --target) TARGET=${2:?--target needs seconds}; ARGN=1 ;;
    --no-mpi) MPI=0 ;;
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,/^set -[eu]/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "$NAME: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
}

# Bytes of a size with an optional K/M/G suffix (powers of 1024).
to_bytes() {
  local n=${1%[KkMmGg]} mult=1
  case "$1" in *[Kk]) mult=1024 ;; *[Mm]) mult=1048576 ;; *[Gg]) mult=1073741824 ;; esac
  case "$n" in '' | *[!0-9]*) echo "$NAME: bad size '$1'" >&2; return 1 ;; esac
  echo $((n * mult))
}

# ---- setup -----------------------------------------------------------------------
# bench_setup PREFIX [NS_A NS_B VETH IP_A IP_B]: the results folder, the mode, SUMMARY, the
# raw files results/PREFIX_MODE.*.tmp (old ones removed, LOG emptied), the run settings, and
# the traps that kill the ranks and remove the namespaces on every exit. Modes: netns (rank 0
# in NS_A at IP_A, rank 1 in NS_B at IP_B, joined by a veth pair named VETH at both ends, each
# rank with HCOMM_HOST_ID set to its namespace; SUMMARY results/PREFIX_summary.txt); local
# (--local: both on 127.0.0.1 with HCOMM_TRANSPORT=tcp unless set, SUMMARY
# results/PREFIX_local_summary.txt); host (a one-host script, only PREFIX given: both on
# 127.0.0.1, SUMMARY results/PREFIX_summary.txt). Rank 0 runs on CPU 0, rank 1 on CPU 1.
# Runs of the netns and local modes stop the script when hcomm did not go over the network
# (`over_network`).
bench_setup() {
  local prefix=$1
  R=$HERE/results
  mkdir -p "$R" "$HERE/build"
  if [ $# = 1 ]; then
    LOCAL=1 MODE=host SUMMARY=$R/${prefix}_summary.txt
  elif [ $LOCAL = 1 ]; then
    MODE=local SUMMARY=$R/${prefix}_local_summary.txt
  fi
  if [ $LOCAL = 1 ]; then
    IPA=127.0.0.1 IPB=127.0.0.1
    ANS="taskset -c 0" BNS="taskset -c 1"
    # Two ranks of one host talk through shared memory: --local measures TCP over loopback.
    [ $MODE = host ] || export HCOMM_TRANSPORT=${HCOMM_TRANSPORT:-tcp}
  else
    MODE=netns SUMMARY=$R/${prefix}_summary.txt
    NSA=$2 NSB=$3 IF=$4 IPA=$5 IPB=$6
    # Each namespace is a host of its own to hcomm: without HCOMM_HOST_ID both ranks see the
    # same hostname and boot id, and link through shared memory (/dev/shm is the machine's).
    ANS="ip netns exec $NSA env HCOMM_HOST_ID=$NSA taskset -c 0"
    BNS="ip netns exec $NSB env HCOMM_HOST_ID=$NSB taskset -c 1"
  fi
  RAW=$R/${prefix}_$MODE
  LOG=$RAW.log.tmp
  rm -f "$RAW".*.tmp
  : >"$LOG"
  export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-30}
  RUN_TIMEOUT=${RUN_TIMEOUT:-300}
  PERF=${HCOMM_PERF:-${CARGO_TARGET_DIR:-$ROOT/target}/release/hcomm_perf}
  HCOMMRUN=${HCOMMRUN:-$(dirname "$PERF")/hcommrun}
  MPIBIN=$HERE/build/mpi_bench_ompi
  NP=2 PIN=1
  PIDS=()
  START=$(date +%s)
  trap cleanup EXIT
  trap 'exit 130' INT TERM
}

log() { echo "$*" | tee -a "$LOG"; }

cleanup() {
  local p
  for p in ${PIDS[@]+"${PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done
  if [ $LOCAL = 0 ]; then
    ip netns del $NSA 2>/dev/null || true
    ip netns del $NSB 2>/dev/null || true
  fi
  return 0
}

# store_port: a port for a job's store, below the kernel's ephemeral ports (32768 up by
# default): the connections of many-rank runs held ports in 30000-50000 that a later run then
# drew for its store, which failed to bind.
store_port() { echo $((20000 + RANDOM % 12000)); }

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
# hcomm_ranks OUTNAME "VAR=VALUE ..." ARGS...: hcomm_perf ARGS --time-target TARGET on NP
# ranks (default 2) with a fresh port and secret each run; rank 0 hosts the store at IPA.
# PIN=1 (default; NP must be 2): rank 0 in A, rank 1 in B (ANS, BNS: namespace and CPU);
# on one host (LOCAL=1) hcommrun starts them instead, pinned with --bind-to core (rank 0 on
# the first allowed core, rank 1 on the second; hcommrun's store on 127.0.0.1 and a fresh
# secret), or by hand as in the other modes when BY_HAND=1 (taskset -c 0 and 1, rank 0 hosting
# the store: for builds whose hcommrun differs). NET_CHECK=0: no over_network check (for an
# hcomm_perf without the transport line). PIN=0: every rank on this host, unpinned. Rank 0's
# table goes to RAW.OUTNAME.tmp and its JSON to RAW.OUTNAME.json.tmp, rank r's stderr to RAW.OUTNAME.err<r>.tmp; the variables are
# added to every rank's environment. Sets RUN_RC0 (rank 0's exit code), RUN_RC1 (the first
# non-zero one of the other ranks, else 0) and RUN_MS (milliseconds); the caller logs them
# and then calls hcomm_notes.
hcomm_ranks() {
  local name=$1 vars=$2; shift 2
  local port
  port=$(store_port)
  local secret r wrap rc
  local pids=()
  secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  [ $PIN = 0 ] || [ $NP = 2 ] || { echo "$NAME: pinned runs have 2 ranks, not $NP" >&2; exit 1; }
  local t0=$(date +%s%N)
  if [ $PIN = 1 ] && [ $LOCAL = 1 ] && [ "${BY_HAND:-0}" = 0 ]; then
    RUN_RC0=0 RUN_RC1=0
    # Rank 0's table and JSON to the raw files, the other rank's output dropped; each rank's
    # stderr to its own file, hcommrun's to err_run.
    J="$RAW.$name.json.tmp" OUT="$RAW.$name.tmp" E="$RAW.$name" \
      env -u HCOMM_ROOT_ADDR -u HCOMM_JOB_SECRET $vars timeout "$RUN_TIMEOUT" \
      "$HCOMMRUN" -n 2 --bind-to core -- sh -c 'if [ "$HCOMM_RANK" = 0 ]; then
          exec "$@" -J "$J" >"$OUT" 2>"$E.err0.tmp"
        else
          exec "$@" >/dev/null 2>"$E.err$HCOMM_RANK.tmp"
        fi' sh "$PERF" "$@" --time-target "$TARGET" 2>"$RAW.$name.err_run.tmp" || RUN_RC0=$?
    RUN_MS=$((($(date +%s%N) - t0) / 1000000))
    [ "$MODE" = host ] || [ $RUN_RC0 != 0 ] || [ "${NET_CHECK:-1}" = 0 ] || over_network "$name"
    return
  fi
  for ((r = 0; r < NP; r++)); do
    wrap=
    [ $PIN = 1 ] && { [ $r = 0 ] && wrap=$ANS || wrap=$BNS; }
    if [ $r = 0 ]; then
      HCOMM_RANK=$r HCOMM_SIZE=$NP HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
        env $vars $wrap timeout "$RUN_TIMEOUT" "$PERF" "$@" --time-target "$TARGET" \
        -J "$RAW.$name.json.tmp" >"$RAW.$name.tmp" 2>"$RAW.$name.err0.tmp" &
    else
      HCOMM_RANK=$r HCOMM_SIZE=$NP HCOMM_ROOT_ADDR=$IPA:$port HCOMM_JOB_SECRET=$secret \
        env $vars $wrap timeout "$RUN_TIMEOUT" "$PERF" "$@" --time-target "$TARGET" \
        >/dev/null 2>"$RAW.$name.err$r.tmp" &
    fi
    pids+=($!)
    PIDS+=($!)
  done
  RUN_RC0=0 RUN_RC1=0
  wait "${pids[0]}" || RUN_RC0=$?
  for ((r = 1; r < NP; r++)); do
    rc=0
    wait "${pids[r]}" || rc=$?
    [ $RUN_RC1 != 0 ] || RUN_RC1=$rc
  done
  RUN_MS=$((($(date +%s%N) - t0) / 1000000))
  [ $PIN = 0 ] || [ "$MODE" = host ] || [ $RUN_RC0 != 0 ] || [ "${NET_CHECK:-1}" = 0 ] ||
    over_network "$name"
}

# over_network OUTNAME: after a pinned run of the netns or local mode (TCP between two hosts,
# or over loopback), checks rank 0's transport line ("# transport of rank 0: peers through
# shared memory S, with a TCP connection T, of P; messages through shared memory M, TCP N,
# plug-in or libfabric O"): no peer through shared memory and some messages over the network,
# else the run measured something else than the script says, and the script stops with an
# error.
over_network() {
  local line why s m n o
  line=$(grep -m1 '^# transport of rank 0:' "$RAW.$1.tmp" 2>/dev/null) || true
  if [ -z "$line" ]; then
    why="no transport line in rank 0's output (hcomm_perf too old? rebuild it)"
  else
    # The numbers after "rank 0": S T P M N O.
    read -r _ s _ _ m n o <<<"$(echo "$line" | tr -c '0-9\n' ' ')"
    if [ "$s" != 0 ]; then
      why="rank 0 reached $s peer(s) through shared memory ($m messages)"
    elif [ $((n + o)) = 0 ]; then
      why="no message went over TCP, a plug-in or libfabric"
    else
      return 0
    fi
  fi
  log "FAILED: hcomm run $1 did not go over the network ($MODE mode): $why"
  log "  ($line)"
  echo "$NAME: hcomm run $1 did not go over the network ($MODE mode: $why): its numbers would be those of shared memory; stopped" >&2
  exit 1
}

# hcomm_notes OUTNAME: after hcomm_ranks, log a timeout and the first lines of the ranks'
# error output.
hcomm_notes() {
  if [ $RUN_RC0 = 124 ] || [ $RUN_RC1 = 124 ]; then
    log "  killed after RUN_TIMEOUT=$RUN_TIMEOUT s (hang or extreme slowness)"
  fi
  { cat "$RAW.$1".err*.tmp | sed 's/^/  stderr: /' | head -6 | tee -a "$LOG"; } 2>/dev/null || true
}

# hcomm_job OUTNAME "VAR=VALUE ..." ARGS...: hcomm_ranks, then a log line and the notes; a
# failed run leaves RAW.OUTNAME.failed.tmp.
hcomm_job() {
  local name=$1 vars=$2; shift 2
  hcomm_ranks "$name" "$vars" "$@"
  log "$(printf 'hcomm %-16s %-26s rank0 rc=%-3s %s rc=%-3s %5d.%d s' "$name" "${vars:--}" $RUN_RC0 \
    "$([ $NP = 2 ] && echo rank1 || echo "rank1..$((NP - 1))")" $RUN_RC1 $((RUN_MS / 1000)) $((RUN_MS % 1000 / 100)))"
  hcomm_notes "$name"
  [ $RUN_RC0 = 0 ] && [ $RUN_RC1 = 0 ] || : >"$RAW.$name.failed.tmp"
}

# ---- Open MPI --------------------------------------------------------------------
# ompi_env: Open MPI refuses to run as root unless told.
ompi_env() { export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; }

# ompi_setup: the mpirun command line in OMPI (netns: launched in A, rank 1 started in B
# through netns_rsh.sh, TCP restricted to the veth; local: loopback, bound to cores).
ompi_setup() {
  ompi_env
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
  # In the background, so that a signal to the script stops it at once (cleanup kills it).
  timeout "$RUN_TIMEOUT" $OMPI "$MPIBIN" "$@" -t "$TARGET" >"$RAW.$name.tmp" 2>"$RAW.$name.err.tmp" &
  PIDS+=($!)
  RUN_RC=0
  wait $! || RUN_RC=$?
  RUN_MS=$((($(date +%s%N) - t0) / 1000000))
}

# ompi_notes OUTNAME: after ompi_run, log the first lines of the error output; a failed run
# leaves RAW.OUTNAME.failed.tmp.
ompi_notes() {
  if [ -s "$RAW.$1.err.tmp" ]; then
    { sed 's/^/  stderr: /' "$RAW.$1.err.tmp" | head -5 | tee -a "$LOG"; } || true
  fi
  [ $RUN_RC = 0 ] || : >"$RAW.$1.failed.tmp"
}

# ompi_job OUTNAME MPI_BENCH_ARGS...: ompi_run, then a log line and the notes.
ompi_job() {
  local name=$1; shift
  ompi_run "$name" "$@"
  log "$(printf 'Open MPI %-19s %-26s rc=%-3s %11s %5d.%d s' "$name" "$*" $RUN_RC "" $((RUN_MS / 1000)) $((RUN_MS % 1000 / 100)))"
  ompi_notes "$name"
}

# failed_runs: a "# FAILED: OUTNAME" line for every run that left RAW.OUTNAME.failed.tmp.
failed_runs() {
  local f
  for f in "$RAW".*.failed.tmp; do
    [ -e "$f" ] || continue
    f=${f%.failed.tmp}
    echo "# FAILED: ${f#"$RAW".}"
  done
}

# ---- comparison ------------------------------------------------------------------
# hc NAME SIZE COLUMN: a column of hcomm_perf's row for SIZE in run NAME (6 = time_us,
# 7 = algbw, 8 = busbw, 10 = algorithm).
hc() {
  [ -f "$RAW.$1.tmp" ] || return 0
  awk -v s="$2" -v c="$3" '!/^#/ && $1 == s { print $c; exit }' "$RAW.$1.tmp"
}
# mpi NAME OP SIZE COLUMN: a column of mpi_bench's row (4 = time_us, 5 = algbw, 6 = busbw).
mpi() {
  [ $MPI = 1 ] && [ -f "$RAW.$1.tmp" ] || return 0
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
gbps() {
  [ -n "$2" ] || return 0
  awk -v s="$1" -v t="$2" -v f="${3:-1}" 'BEGIN { if (t > 0) printf "%.4g", s / t / 1e3 * f }'
}
# verdict RATIO OP LIMIT: "ok" when RATIO OP LIMIT holds (OP: le or ge), "MISSED" otherwise,
# n/a without a ratio.
verdict() {
  case "$1" in n/a | '') echo "n/a"; return 0 ;; esac
  awk -v r="$1" -v op="$2" -v l="$3" 'BEGIN { ok = (op == "le") ? r <= l : r >= l; print ok ? "ok" : "MISSED" }'
}
# cmp_head / cmp_line LABEL HCOMM OMPI [TARGET_TEXT VERDICT] [ALGO]: the comparison table's
# title line and rows (ratio = HCOMM / OMPI).
cmp_head() {
  printf '%-38s %11s %11s %7s  %-8s %-7s %s\n' "metric" "hcomm" "Open MPI" "ratio" "target" "verdict" "algo"
}
cmp_line() {
  printf '%-38s %11s %11s %7s  %-8s %-7s %s\n' "$1" "${2:-n/a}" "${3:-n/a}" "$(ratio "${2:-}" "${3:-}")" \
    "${4:-}" "${5:-}" "${6:-}"
}

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
run_log() { { grep -v '^#' "$LOG" | sed 's/^/# run: /'; } || true; }

# summary_runs: the summary's lines on the runs (total time since bench_setup, every run's
# log line, the failed ones) and the legend of the comparison table that follows.
summary_runs() {
  echo "# total time: $(($(date +%s) - START)) s"
  run_log
  failed_runs
  echo "#"
  echo "# ratio = hcomm / Open MPI: for time (us) below 1 means hcomm is faster, for bandwidth"
  echo "# (GB/s) above 1 means hcomm is faster; algo = hcomm's algorithm for that size"
}

# raw_tables TITLE_PREFIX OUTNAME...: every raw table that exists, each after a title line
# "# ---- TITLE_PREFIX OUTNAME ----".
raw_tables() {
  local title=$1 f
  shift
  for f in "$@"; do
    [ -f "$RAW.$f.tmp" ] || continue
    echo
    echo "# ---- $title $f ----"
    cat "$RAW.$f.tmp"
  done
}

# ---- libfabric between two namespaces (ofi_tcp.sh, ofi_direct.sh) ---------------------
# ofi_args "$@": the options of the libfabric scripts: --rounds N (ROUNDS, default 3),
# --no-intel (INTEL=0; default 1) and common_arg's, but not --local (the peers need the
# namespaces); sets MAXB from --max (default 16M).
ofi_args() {
  LOCAL=0 MAX=16M TARGET=0.2 BUILD=1 MPI=0 ROUNDS=3 INTEL=1
  while [ $# -gt 0 ]; do
    case "$1" in
      --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2; continue ;;
      --no-intel) INTEL=0; shift; continue ;;
      --local) echo "$NAME: --local is not offered: the peers need the namespaces" >&2; exit 2 ;;
    esac
    common_arg "$@"
    shift $ARGN
    shift
  done
  MAXB=$(to_bytes "$MAX") || exit 2
}

# ofi_setup PREFIX NS_A NS_B VETH IP_A IP_B: bench_setup in netns mode with every rank at
# niceness NICE (default -20; rank 0 on CPU 0 in NS_A, rank 1 on CPU 1 in NS_B), hcomm built,
# and Intel MPI and oneCCL looked for in IV (INTEL_VENV, default /opt/hcomm-peers/intel;
# INTEL=0 when they are missing). The caller makes the namespaces (ns_up) when ready.
ofi_setup() {
  NICE=${NICE:--20}
  bench_setup "$@"
  # Each namespace a host of its own to hcomm, as in bench_setup (without HCOMM_HOST_ID both
  # ranks share the hostname and boot id: hcomm's topology then holds one host, and its cost
  # model picks one host's algorithms, e.g. the ring all-reduce from 64 KiB).
  ANS="ip netns exec $NSA env HCOMM_HOST_ID=$NSA nice -n $NICE taskset -c 0"
  BNS="ip netns exec $NSB env HCOMM_HOST_ID=$NSB nice -n $NICE taskset -c 1"
  build_hcomm
  IV=${INTEL_VENV:-/opt/hcomm-peers/intel}
  if [ $INTEL = 1 ] && { [ ! -x "$IV/hcomm-bench/mpi_bench_impi" ] || [ ! -x "$IV/hcomm-bench/ccl_bench" ]; }; then
    log "# Intel MPI / oneCCL not found in $IV (bench/intel/setup.sh): skipped"
    INTEL=0
  fi
}

# intel_run PEER OUTNAME OPS: mpi_bench (impi) or ccl_bench (ccl) at SIZES (up to MAXB)
# between the namespaces through hydra over netns_rsh.sh, all traffic libfabric tcp over the
# veth (I_MPI_FABRICS=ofi: the namespaces share /dev/shm, no shared-memory path may be taken;
# oneCCL likewise CCL_ATL_SHM=0, and CCL_MNIC_NAME/CCL_KVS_IFACE on the veth); the table to
# RAW.OUTNAME.tmp, a failed run leaves RAW.OUTNAME.failed.tmp.
# Checked (2026-12-02, probes with I_MPI_DEBUG, gdb, strace -c attached to a running rank, the
# veth's packet counters): Intel MPI takes libfabric 2.4's own tcp provider, whose RDM endpoint
# is native (xnet_rdm_*, no ofi_rxm layer, unlike Debian's 1.17 "tcp;ofi_rxm"); an 8 B
# ping-pong costs each rank one sendto and one recvfrom per message (plus ~29 empty
# epoll_wait of its busy polling), and the veth counts about one packet per message, so no
# shared memory is used between the namespaces and its ~3.3 us are TCP over the veth. About
# half of those probe runs hung at start (rank 0 in connect() under xnet_rdm_tinject in
# MPI_Barrier) until RUN_TIMEOUT.
intel_run() {
  local peer=$1 name=$2 ops=$3 t0 rc=0 sizes
  sizes=$(for s in $SIZES; do [ "$s" -le "$MAXB" ] && printf '%s,' "$s"; done)
  local args="-s ${sizes%,} -t $TARGET -o $ops"
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

# time_of NAME SIZE [OP]: the time (us) of SIZE in raw table NAME: hcomm_perf's column 6,
# ofi_pingpong's (bare*) column 2, mpi_bench/ccl_bench's (impi*, ccl*) column 4 under
# "# op: OP"; nothing for a failed or missing run.
time_of() {
  [ -f "$RAW.$1.tmp" ] && [ ! -e "$RAW.$1.failed.tmp" ] || return 0
  case $1 in
    bare*) awk -v s="$2" '!/^#/ && $1 == s { print $2; exit }' "$RAW.$1.tmp" ;;
    impi* | ccl*) awk -v op="$3" -v s="$2" '/^# op:/ { cur = $3 } !/^#/ && cur == op && $1 == s { print $4; exit }' "$RAW.$1.tmp" ;;
    *) hc "$1" "$2" 6 ;;
  esac
}

# median NAME SIZE [OP]: the median over the ROUNDS rounds (runs NAME.1 .. NAME.ROUNDS) of
# time_of (empty when no round has it).
median() {
  local r
  for ((r = 1; r <= ROUNDS; r++)); do time_of "$1.$r" "$2" "${3:-}"; done |
    sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# ab_round ROUND OPS INTEL_OPS HCOMM_PERF_ARGS...: one round of the hcomm variants of
# VARIANTS ("name:variables" each, two or more) in turns for each op of OPS (hcomm_perf OP
# ARGS, runs NAME_OP.ROUND), the order rotated by one from round to round (with two: the first
# one alternates); then Intel MPI and oneCCL at INTEL_OPS (runs impi.ROUND, ccl.ROUND) unless
# INTEL=0.
ab_round() {
  local round=$1 ops=$2 iops=$3 op i k t n=${#VARIANTS[@]}
  shift 3
  for op in $ops; do
    for ((k = 0; k < n; k++)); do
      i=$(((k + round - 1) % n))
      t=${VARIANTS[$i]}
      hcomm_job "${t%%:*}_$op.$round" "${t#*:}" "$op" "$@"
    done
  done
  if [ $INTEL = 1 ]; then
    intel_run impi "impi.$round" "$iops"
    intel_run ccl "ccl.$round" "$iops"
  fi
}

# ab_table A B OPS: per op of OPS and size of SIZES, the medians of variants A and B, Intel
# MPI and oneCCL, and A/B (columns A(us), B(us), impi(us), ccl(us), A/B).
ab_table() {
  local a=$1 b=$2 op s x y impi ccl
  printf '%-10s %9s %12s %12s %9s %9s %16s\n' op size "$a(us)" "$b(us)" "impi(us)" "ccl(us)" "$a/$b"
  for op in $3; do
    for s in $SIZES; do
      x=$(median "${a}_$op" "$s") y=$(median "${b}_$op" "$s")
      impi=$(median impi "$s" "$op") ccl=$(median ccl "$s" "$op")
      printf '%-10s %9s %12s %12s %9s %9s %16s\n' "$op" "$s" "${x:-n/a}" "${y:-n/a}" "${impi:-n/a}" \
        "${ccl:-n/a}" "$(ratio "$x" "$y")"
    done
  done
}
