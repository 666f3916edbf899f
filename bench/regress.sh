#!/usr/bin/env bash
# regress.sh - this build against a base build, interleaved in one run: hcomm's own figures of
# shm.sh, coll_tcp.sh, p2p_tcp.sh and sidebyside.sh, each measured with both builds' hcomm_perf
# and hcommrun, round after round, the two builds alternating which goes first.
#
# Parts (the same launches, pinning and namespaces as the scripts they stand for):
#   shm  one host, 2 ranks pinned one per core (rank 0 on CPU 0, rank 1 on CPU 1), started by
#        hand (BY_HAND=1 of common.sh: hcommrun's launch protocol changed since a27d6a5, whose
#        hcommrun has no --bind-to either), the engine's transport: pingpong; allreduce, broadcast, allgather with buffers on the
#        heap and in the pool (shm.sh uses the pool, sidebyside.sh both); a 256 MiB allreduce
#        (pool and heap); the TCP-loopback reference (HCOMM_TRANSPORT=tcp: pingpong 8 B,
#        allreduce 16 MiB); 8 and 32 ranks unpinned on the 2 cores, allreduce 1 KiB and 1 MiB (pool).
#   tcp  two network namespaces (hcr_a 10.75.0.1, hcr_b 10.75.0.2, veth hcr_veth), one rank in
#        each (CPU 0, CPU 1), HCOMM_HOST_ID per namespace, checked to go over TCP: allreduce,
#        broadcast, allgather, a 256 MiB allreduce, allreduce with HCOMM_MISMATCH_CHECK=0 and
#        with HCOMM_DETERMINISTIC=1 (coll_tcp.sh); pingpong and stream, with the defaults and with
#        HCOMM_SPIN_US=1000000 (p2p_tcp.sh).
# Sizes: 8 B alone (the latency figures), then 64 KiB, 1 MiB and 16 MiB in one run (-f 16; the
# mismatch-check run stops at 1 MiB), and the 256 MiB runs (3 timed calls, -n 3 -w 1 -c 0). Every figure is a time in us (the
# median of the slowest rank, from hcomm_perf); bandwidth is size / time, so a time ratio above
# 1 is the same loss of bandwidth.
#
# usage: BASE_BIN=DIR bench/regress.sh [--base DIR] [--rounds N] [--target SECS] [--noise PCT]
#                                      [--no-shm] [--no-tcp] [--no-big] [--no-build]
#   --base DIR   the base build's folder with its hcomm_perf (or BASE_BIN=DIR), e.g. a release
#                folder of a27d6a5: /work/base-a27d6a5
#   --rounds N   interleaved rounds (default 3); per figure the median over the rounds
#   --target S   seconds of timed iterations per size (default 0.1)
#   --noise PCT  a figure is called worse (better) when the median ratio is above 1 + PCT/100
#                (below 1 - PCT/100) and every round's ratio is above (below) 1 (default 5)
#   --no-shm, --no-tcp  skip a part; --no-big  skip the 256 MiB runs
#   --no-build   do not build this tree first (cargo build --release -p hcomm-tools)
# This build: CUR_BIN=DIR (default target/release, or CARGO_TARGET_DIR's). Environment as the
# other scripts (HCOMM_TIMEOUT default 30 s, RUN_TIMEOUT default 300 s per run). Needs root for
# the tcp part. Time: on the 2-core VM at load 10-25, 246 s (shm) and 194 s (tcp) of runs besides
# the 256 MiB ones (3 rounds, target 0.1 s), which took 330 and 183 s before they were cut to
# -n 3 -w 1 -c 0.
#
# Output: results/regress_summary.txt: per figure and size the median time of this build and of
# the base, the ratio this / base, the range of the rounds' ratios and the verdict; raw files
# results/regress_*.tmp (git-ignored). Exit status 1 when a run failed.
set -u
CALLER=$PWD
. "$(dirname "$0")/common.sh" || exit 1

LOCAL=1 MPI=0 TARGET=0.1 BUILD=1 ROUNDS=3 NOISE=5 DOSHM=1 DOTCP=1 DOBIG=1
BASE=${BASE_BIN:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --base) BASE=${2:?--base needs a folder}; shift ;;
    --rounds) ROUNDS=${2:?--rounds needs a number}; shift ;;
    --noise) NOISE=${2:?--noise needs a percentage}; shift ;;
    --no-shm) DOSHM=0 ;;
    --no-tcp) DOTCP=0 ;;
    --no-big) DOBIG=0 ;;
    --local | --max | --no-mpi) echo "$NAME: no $1 here (see --help)" >&2; exit 2 ;;
    *) common_arg "$@"; shift "$ARGN" ;;
  esac
  shift
done
case "$ROUNDS" in '' | *[!0-9]* | 0) echo "$NAME: --rounds needs 1 or more" >&2; exit 2 ;; esac
CUR=${CUR_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
[ -n "$BASE" ] || { echo "$NAME: which base build? (BASE_BIN=DIR or --base DIR)" >&2; exit 2; }
# Relative folders are the caller's.
BASE=$(cd "$CALLER" && cd "$BASE" 2>/dev/null && pwd) CUR=$(cd "$CALLER" && cd "$CUR" 2>/dev/null && pwd)
[ -x "$BASE/hcomm_perf" ] || { echo "$NAME: no hcomm_perf in '$BASE' (BASE_BIN or --base)" >&2; exit 2; }
[ -x "$CUR/hcomm_perf" ] || { echo "$NAME: no hcomm_perf in '$CUR' (build it, or CUR_BIN)" >&2; exit 2; }
[ "$(nproc)" -ge 2 ] || { echo "$NAME: needs 2 CPUs" >&2; exit 1; }
if [ $BUILD = 1 ] && [ -z "${CUR_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release -p hcomm-tools) || { echo "$NAME: cargo build failed" >&2; exit 1; }
fi
T0=$(date +%s) LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

# Figures of a part: "NAME|RANKS|VARS|ARGS" (RANKS 2: pinned one per core; more: unpinned).
BW="-b 64K -e 16M -f 16"
SHM_FIGS=(
  "pingpong_8|2|-|pingpong -b 8 -e 8"
  "pingpong|2|-|pingpong $BW"
)
for mem in pool heap; do
  for op in allreduce broadcast allgather; do
    SHM_FIGS+=("${op}_8_$mem|2|-|$op -b 8 -e 8 --mem $mem" "${op}_$mem|2|-|$op $BW --mem $mem")
  done
done
# The 256 MiB runs: 3 timed calls after 1 warm-up and no checked call (with the defaults, the
# estimate's 5 calls and the check took 30 s a run on the loaded 2-core host).
BIG="-b 256M -e 256M -n 3 -w 1 -c 0"
[ $DOBIG = 1 ] && SHM_FIGS+=("allreduce_256M_pool|2|-|allreduce $BIG --mem pool"
  "allreduce_256M_heap|2|-|allreduce $BIG --mem heap")
SHM_FIGS+=(
  "tcp_pingpong_8|2|HCOMM_TRANSPORT=tcp|pingpong -b 8 -e 8"
  "tcp_allreduce_16M|2|HCOMM_TRANSPORT=tcp|allreduce -b 16M -e 16M"
  "over8_allreduce_1K|8|-|allreduce -b 1K -e 1K --mem pool"
  "over8_allreduce_1M|8|-|allreduce -b 1M -e 1M --mem pool"
  "over32_allreduce_1K|32|-|allreduce -b 1K -e 1K --mem pool"
  "over32_allreduce_1M|32|-|allreduce -b 1M -e 1M --mem pool"
)
TCP_FIGS=()
for op in allreduce broadcast allgather; do TCP_FIGS+=("${op}_8|2|-|$op -b 8 -e 8" "$op|2|-|$op $BW"); done
[ $DOBIG = 1 ] && TCP_FIGS+=("allreduce_256M|2|-|allreduce $BIG")
TCP_FIGS+=(
  "mm_off_8|2|HCOMM_MISMATCH_CHECK=0|allreduce -b 8 -e 8"
  "mm_off|2|HCOMM_MISMATCH_CHECK=0|allreduce -b 64K -e 1M -f 16"
  "determ_8|2|HCOMM_DETERMINISTIC=1|allreduce -b 8 -e 8"
  "determ|2|HCOMM_DETERMINISTIC=1|allreduce $BW"
)
for v in "" spin_; do
  vars=-
  [ -z "$v" ] || vars=HCOMM_SPIN_US=1000000
  for op in pingpong stream; do TCP_FIGS+=("$v${op}_8|2|$vars|$op -b 8 -e 8" "$v$op|2|$vars|$op $BW"); done
done

# use_bin DIR: the hcomm_perf of a build for the next runs. Only this build's tcp runs are
# checked to go over the network (an older hcomm_perf may not print the transport line; the
# base runs in the same namespaces with the same HCOMM_HOST_ID).
use_bin() {
  PERF=$1/hcomm_perf NET_CHECK=1
  [ "$1" = "$CUR" ] || NET_CHECK=0
}
BY_HAND=1

# run_part PART: every figure of the part, ROUNDS times, both builds per figure; the base first
# in odd rounds, this build first in even ones. Raw tables RAW.FIG_{cur,base}ROUND.tmp.
run_part() {
  local part=$1 r fig name np vars args b order
  local -n figs=${part^^}_FIGS
  for ((r = 1; r <= ROUNDS; r++)); do
    order="base cur"
    [ $((r % 2)) = 1 ] || order="cur base"
    for fig in "${figs[@]}"; do
      IFS='|' read -r name np vars args <<<"$fig"
      [ "$vars" != - ] || vars=""
      NP=$np PIN=1
      [ "$np" = 2 ] || PIN=0
      for b in $order; do
        if [ $b = cur ]; then use_bin "$CUR"; else use_bin "$BASE"; fi
        # shellcheck disable=SC2086 # ARGS are words
        hcomm_job "${name}_$b$r" "$vars" $args
      done
    done
  done
  NP=2 PIN=1
}

# ---- comparison ------------------------------------------------------------------
# ratio3 A B: A / B with three decimals, or n/a.
ratio3() {
  if [ -n "$1" ] && [ -n "$2" ]; then
    awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "n/a" }'
  else
    echo n/a
  fi
}
# tus NAME SIZE: the time (us) of SIZE in run NAME, from rank 0's JSON (ns digits; the table
# rounds to 10 ns, 4 % of an 8 B call), else from its table.
tus() {
  local t=
  [ -f "$RAW.$1.json.tmp" ] && t=$(awk -v s="$2" '/"size":/ { gsub(/[^0-9]/, "", $2); cur = $2 }
    /"time_us":/ && cur == s { gsub(/,/, "", $2); print $2; exit }' "$RAW.$1.json.tmp")
  [ -n "$t" ] && echo "$t" || hc "$1" "$2" 6
}
# median: the median of the numbers on stdin (the lower middle one of an even count).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.4f\n", v[int((NR + 1) / 2)] }'; }
WORSE=0 BETTER=0
# part_rows PART: a row per figure and size of the part's raw tables.
part_rows() {
  local part=$1 fig name s r c b rs lo hi med verdict sizes
  local -n figs=${part^^}_FIGS
  for fig in "${figs[@]}"; do
    name=${fig%%|*}
    sizes=$(for ((r = 1; r <= ROUNDS; r++)); do
      awk '!/^#/ && $1 ~ /^[0-9]+$/ { print $1 }' "$RAW.${name}_cur$r.tmp" "$RAW.${name}_base$r.tmp" 2>/dev/null
    done | sort -n -u)
    for s in $sizes; do
      c=$(for ((r = 1; r <= ROUNDS; r++)); do tus "${name}_cur$r" "$s"; done | median)
      b=$(for ((r = 1; r <= ROUNDS; r++)); do tus "${name}_base$r" "$s"; done | median)
      rs=$(for ((r = 1; r <= ROUNDS; r++)); do
        ratio3 "$(tus "${name}_cur$r" "$s")" "$(tus "${name}_base$r" "$s")"
        echo
      done | grep -v n/a | sort -g)
      lo=$(head -1 <<<"$rs") hi=$(tail -1 <<<"$rs")
      med=$(ratio3 "$c" "$b")
      verdict=$(awk -v m="$med" -v lo="$lo" -v hi="$hi" -v n="$NOISE" 'BEGIN {
        if (m == "n/a" || lo == "") print "n/a"
        else if (m > 1 + n / 100 && lo > 1) print "WORSE"
        else if (m < 1 - n / 100 && hi < 1) print "better"
        else print "same" }')
      case $verdict in WORSE) WORSE=$((WORSE + 1)) ;; better) BETTER=$((BETTER + 1)) ;; esac
      printf '%-4s %-22s %10s %12s %12s %7s %12s  %s\n' "$part" "$name" "$s" "${c:-n/a}" "${b:-n/a}" "$med" \
        "${lo:-?}-${hi:-?}" "$verdict"
    done
  done
}

PARTS=()
if [ $DOSHM = 1 ]; then
  bench_setup regress_shm
  RAW_SHM=$RAW LOG_SHM=$LOG
  log "# shm: one host, ranks started by hand, taskset -c 0 and -c 1"
  run_part shm
  teardown
  PARTS+=(shm)
fi
if [ $DOTCP = 1 ]; then
  LOCAL=0
  bench_setup regress_tcp hcr_a hcr_b hcr_veth 10.75.0.1 10.75.0.2
  RAW_TCP=$RAW LOG_TCP=$LOG
  ns_up
  run_part tcp
  teardown
  PARTS+=(tcp)
fi

SUMMARY=$HERE/results/regress_summary.txt
FAILED=""
{
  echo "# this build against a base build, interleaved, bench/regress.sh"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host: $(uname -n)  cpus: $(nproc)  load at start: $LOAD0  at end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# this: $CUR (tree $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "# base: $BASE$([ -f "$BASE/COMMIT" ] && echo " (commit $(cat "$BASE/COMMIT"))")"
  echo "# HCOMM settings: $(env | grep '^HCOMM_' | grep -v '^HCOMM_JOB_SECRET' | sort | tr '\n' ' ')"
  echo "# rounds $ROUNDS (base first in odd rounds), time target $TARGET s per size, total $(($(date +%s) - T0)) s"
  echo "# time = median over the rounds of hcomm_perf's time (us); ratio = this / base (above 1: this"
  echo "# build is slower); rounds = range of the rounds' ratios; WORSE / better: median ratio beyond"
  echo "# +-$NOISE % and every round on that side"
  for part in ${PARTS[@]+"${PARTS[@]}"}; do
    [ $part = shm ] && RAW=$RAW_SHM LOG=$LOG_SHM || RAW=$RAW_TCP LOG=$LOG_TCP
    run_log
    failed_runs
  done
  printf '%-4s %-22s %10s %12s %12s %7s %12s  %s\n' part figure size "this (us)" "base (us)" ratio rounds verdict
  for part in ${PARTS[@]+"${PARTS[@]}"}; do
    [ $part = shm ] && RAW=$RAW_SHM || RAW=$RAW_TCP
    part_rows $part
  done
  echo "# worse: $WORSE, better: $BETTER"
} >"$SUMMARY"
grep -v '^# run: ' "$SUMMARY"
echo "summary: $SUMMARY"
if grep -q '^# FAILED' "$SUMMARY"; then
  echo "$NAME: some runs failed (see the # FAILED lines of the summary)" >&2
  exit 1
fi
