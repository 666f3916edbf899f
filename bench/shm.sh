#!/usr/bin/env bash
# shm.sh - hcomm vs Open MPI on one host, through shared memory, in the same run.
#
# Part 1, 2 ranks, one per core (rank 0 on CPU 0, rank 1 on CPU 1):
#   * hcomm:    hcomm_perf pingpong, allreduce (float32, sum), broadcast and allgather,
#               8 B..--max, plus one allreduce at --big (default 256M); ranks started by
#               hcommrun --bind-to core (rank 0 on the first core, rank 1 on the second; its
#               store on 127.0.0.1, a fresh HCOMM_JOB_SECRET); every result checked (-c 1). HCOMM_TRANSPORT is left
#               unset (the engine picks the transport). The collectives get `--mem pool`
#               (buffers in hcomm's shared-memory pool) when `hcomm_perf OP --help` lists
#               --mem, else they run on heap buffers.
#   * Open MPI: mpi_bench -o pingpong / allreduce / bcast / allgather (and allreduce at --big)
#               with OMPI_MCA_btl_vader_single_copy_mechanism=cma mpirun.openmpi -np 2
#               --bind-to core --mca btl vader,self
#   Each operation runs hcomm then Open MPI, so both see about the same machine load.
#   Ratios hcomm / Open MPI against the targets: 8 B pingpong half round trip <= 0.8;
#   8 B allreduce time <= 0.8 (both from --reps more runs of that size alone, hcomm and
#   Open MPI alternating: the medians of the runs' medians, and the range of the pairs'
#   ratios; this VM's cross-core latency changes from run to run, 145 or 220 ns); allreduce busbw >= 2 at 1 MiB and 16 MiB, >= 4 at 256 MiB;
#   allgather busbw at 16 MiB >= 1.5; broadcast busbw at 16 MiB >= 1.2.
# Reference: hcomm again with HCOMM_TRANSPORT=tcp (TCP over loopback, heap buffers, same
#   pinning): 8 B pingpong and 16 MiB allreduce, against the same Open MPI numbers.
# Part 2, --np ranks (default 8) on the 2 cores, oversubscribed and unpinned: 1 MiB float32
#   allreduce, hcomm (defaults) vs Open MPI with its default settings (mpirun.openmpi
#   --oversubscribe -np 8, no MCA settings: OMPI_MCA_* variables are removed for this run);
#   ratio of the times, no target (below 1: hcomm is faster).
#
# usage: bench/shm.sh [--max SIZE] [--big SIZE] [--np N] [--reps N] [--target SECS] [--no-mpi]
#                     [--no-build] [--no-big] [--no-tcp] [--no-over]
#   --max SIZE   largest size of the sweeps (default 16M; K/M/G = powers of 1024)
#   --big SIZE   the single large allreduce (default 256M; the >= 4x target is for 256M)
#   --np N       ranks of the oversubscribed part (default 8)
#   --reps N     alternating runs of the 8 B latencies (default 5)
#   --target S   seconds of timed iterations per size (default 0.2)
#   --no-mpi     skip Open MPI
#   --no-build   use the hcomm_perf binary as it is
#   --no-big     skip the large allreduce
#   --no-tcp     skip the HCOMM_TRANSPORT=tcp reference runs
#   --no-over    skip the oversubscribed part
# Environment: HCOMM_* settings (HCOMM_SPIN_US, HCOMM_TIMEOUT (default here 30 s), ...) reach
# the hcomm ranks; RUN_TIMEOUT (default 300 s) bounds each run; HCOMM_PERF points at another
# hcomm_perf binary.
#
# Output: results/shm_summary.txt with the comparison and every raw table; raw files
# results/shm_host.*.tmp (git-ignored). Exit status 1 when a run failed (the summary is
# written all the same), 0 otherwise: missed targets are not an error.
set -euo pipefail
. "$(dirname "$0")/common.sh"

LOCAL=1 MAX=16M BIG=256M TARGET=0.2 BUILD=1 MPI=1 DOBIG=1 TCPREF=1 OVER=1 OVER_NP=8 REPS=5
while [ $# -gt 0 ]; do
  case "$1" in
    --big) BIG=${2:?--big needs a size}; shift ;;
    --np) OVER_NP=${2:?--np needs a number of ranks}; shift ;;
    --reps) REPS=${2:?--reps needs a number}; shift ;;
    --no-big) DOBIG=0 ;;
    --no-tcp) TCPREF=0 ;;
    --no-over) OVER=0 ;;
    --local) echo "$NAME: always runs on one host (no --local)" >&2; exit 2 ;;
    *) common_arg "$@"; shift "$ARGN" ;;
  esac
  shift
done
MAXB=$(to_bytes "$MAX")
BIGB=$(to_bytes "$BIG")
case "$OVER_NP" in '' | *[!0-9]* | 0 | 1) echo "$NAME: --np needs 2 or more ranks" >&2; exit 2 ;; esac
case "$REPS" in '' | *[!0-9]* | 0) echo "$NAME: --reps needs 1 or more runs" >&2; exit 2 ;; esac
# The TCP reference's allreduce size and the sizes with targets.
REFB=16777216 MIB=1048576 TARGET_BIG=268435456

bench_setup shm

# ---- build ---------------------------------------------------------------------
build_hcomm
"$PERF" allreduce --help >/dev/null 2>&1 || { echo "$NAME: $PERF has no collectives (rebuild it)" >&2; exit 1; }
build_mpi
[ "$(nproc)" -ge 2 ] || { echo "$NAME: needs 2 CPUs (rank 0 on CPU 0, rank 1 on CPU 1)" >&2; exit 1; }

# mem_args OP: "--mem pool" when `hcomm_perf OP --help` lists a --mem option, else nothing.
mem_args() {
  local help
  help=$("$PERF" "$1" --help 2>&1 || true)
  if grep -qE -- '--mem([^-[:alnum:]]|$)' <<<"$help"; then echo "--mem pool"; fi
}
MEM=$(mem_args allreduce)
BUFS=${MEM:+pool (--mem pool)}
log "# hcomm collectives' buffers: ${BUFS:-heap (this hcomm_perf has no --mem)}"

# ---- part 1: 2 ranks, one per core -------------------------------------------------
ompi_env
OMPI="env OMPI_MCA_btl_vader_single_copy_mechanism=cma mpirun.openmpi --allow-run-as-root
  -np 2 --bind-to core --mca btl vader,self"
# both OUTNAME MPI_OP "HCOMM_PERF ARGS" "MPI_BENCH ARGS": hcomm, then Open MPI (OUTNAME_ompi).
both() {
  hcomm_job "$1" "" $3
  if [ $MPI = 1 ]; then ompi_job "$1_ompi" -o "$2" $4; fi
}
SWEEP="-b 8 -e $MAXB -f 2"
both pingpong pingpong "pingpong $SWEEP" "-b 8 -e $MAXB"
both allreduce allreduce "allreduce $SWEEP -d float32 -o sum $MEM" "-b 8 -e $MAXB"
both broadcast bcast "broadcast $SWEEP -d float32 $MEM" "-b 8 -e $MAXB"
both allgather allgather "allgather $SWEEP -d float32 $MEM" "-b 8 -e $MAXB"
# The 8 B latencies again, alone and alternating, --reps times.
for ((i = 0; i < REPS; i++)); do
  both "lat_pp$i" pingpong "pingpong -b 8 -e 8" "-b 8 -e 8"
  both "lat_ar$i" allreduce "allreduce -b 8 -e 8 -d float32 -o sum $MEM" "-b 8 -e 8"
done
if [ $DOBIG = 1 ]; then
  # Default pool settings: buffers beyond an ordinary block get a pool block of their own.
  hcomm_job allreduce_big "" allreduce -b $BIGB -e $BIGB -d float32 -o sum $MEM
  if [ $MPI = 1 ]; then ompi_job allreduce_big_ompi -o allreduce -s $BIGB; fi
fi
if [ $TCPREF = 1 ]; then
  hcomm_job tcp_pingpong HCOMM_TRANSPORT=tcp pingpong -b 8 -e 8
  hcomm_job tcp_allreduce HCOMM_TRANSPORT=tcp allreduce -b $REFB -e $REFB -d float32 -o sum
fi

# ---- part 2: OVER_NP ranks on 2 cores, unpinned ----------------------------------
if [ $OVER = 1 ]; then
  NP=$OVER_NP PIN=0
  hcomm_job over_allreduce "" allreduce -b $MIB -e $MIB -d float32 -o sum $MEM
  NP=2 PIN=1
  if [ $MPI = 1 ]; then
    # Open MPI's defaults: no MCA settings from the environment either.
    OMPI="env $(env | sed -n 's/^\(OMPI_MCA_[^=]*\)=.*/-u \1/p' | tr '\n' ' ')
      mpirun.openmpi --allow-run-as-root --oversubscribe -np $OVER_NP"
    ompi_job over_allreduce_ompi -s $MIB -o allreduce
  fi
fi

teardown

# ---- comparison ------------------------------------------------------------------
MET=0 MISSED=0 NA=0
# target_line LABEL HCOMM OMPI OP LIMIT [ALGO]: a row with its target (OP: le or ge), counted.
target_line() {
  local v
  v=$(verdict "$(ratio "$2" "$3")" "$4" "$5")
  case $v in ok) MET=$((MET + 1)) ;; MISSED) MISSED=$((MISSED + 1)) ;; *) NA=$((NA + 1)) ;; esac
  cmp_line "$1" "$2" "$3" "$(case $4 in le) echo "<=" ;; *) echo ">=" ;; esac) $5" "$v" "${6:-}"
}
# time_of NAME MPIOP SIZE / bw_of NAME MPIOP SIZE FACTOR: "HCOMM OMPI" (time in us, or
# busbw in GB/s from the time column) for target_line/cmp_line.
time_of() { H=$(hc "$1" "$3" 6) M=$(mpi "$1_ompi" "$2" "$3" 4) A=$(hc "$1" "$3" 10); }
# median: the median of the numbers on stdin (the lower middle one of an even count).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
# reps_of PREFIX MPIOP: time_of for the 8 B runs PREFIX0.. (medians over the runs), and R,
# the range of the runs' ratios.
reps_of() {
  local i h m rs=()
  H=$(for ((i = 0; i < REPS; i++)); do hc "$1$i" 8 6; done | median)
  M=$(for ((i = 0; i < REPS; i++)); do mpi "$1${i}_ompi" "$2" 8 4; done | median)
  A=$(hc "${1}0" 8 10)
  for ((i = 0; i < REPS; i++)); do
    h=$(hc "$1$i" 8 6) m=$(mpi "$1${i}_ompi" "$2" 8 4)
    rs+=("$(ratio "$h" "$m")")
  done
  R=$(printf '%s\n' "${rs[@]}" | grep -v n/a | sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { if (NR) print lo "-" hi }')
}
bw_of() {
  H=$(gbps "$3" "$(hc "$1" "$3" 6)" "$4") M=$(gbps "$3" "$(mpi "$1_ompi" "$2" "$3" 4)" "$4")
  A=$(hc "$1" "$3" 10)
}
# bw_row NAME MPIOP SIZE FACTOR LIMIT: a bus bandwidth row with target >= LIMIT, when the run
# covered SIZE (else no row).
bw_row() {
  local hit
  hit=$(hc "$1" "$3" 1)
  [ -n "$hit" ] || [ "$3" -le "$MAXB" ] || return 0
  bw_of "$1" "$2" "$3" "$4"
  target_line "$1 $3 B busbw (GB/s)" "$H" "$M" ge "$5" "$A"
}
{
  summary_head "hcomm vs Open MPI (shared memory) on one host, bench/shm.sh" \
    "  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# time target ${TARGET} s per size, sizes 8..$MAXB B (x2), float32; time = median of the"
  echo "# slowest rank (both tools); busbw = size/time x 2(n-1)/n (allreduce), x 1 (broadcast,"
  echo "# pingpong), x (n-1)/n (allgather); GB/s = 1e9 B/s; allgather size = the whole output"
  echo "# hcomm: hcommrun -n 2 --bind-to core (rank 0 on the first core, rank 1 on the second); collectives'"
  echo "# buffers: ${BUFS:-heap}; transport: $(if [ -n "${HCOMM_TRANSPORT:-}" ]; then echo "HCOMM_TRANSPORT=$HCOMM_TRANSPORT"; else echo "the engine's choice (HCOMM_TRANSPORT unset; hcomm_perf does not report it)"; fi)"
  [ $MPI = 1 ] && echo "# Open MPI: OMPI_MCA_btl_vader_single_copy_mechanism=cma mpirun.openmpi -np 2 --bind-to core --mca btl vader,self"
  summary_runs
  echo "#"
  echo "# 2 ranks, one per core"
  cmp_head
  reps_of lat_pp pingpong
  target_line "pingpong 8 B half-RTT (us)" "$H" "$M" le 0.8
  echo "#   $REPS runs each, alternating; ratios of the runs: ${R:-n/a}"
  reps_of lat_ar allreduce
  target_line "allreduce 8 B time (us)" "$H" "$M" le 0.8 "$A"
  echo "#   $REPS runs each, alternating; ratios of the runs: ${R:-n/a}"
  bw_row allreduce allreduce $MIB 1 2
  bw_row allreduce allreduce $REFB 1 2
  if [ $DOBIG = 1 ]; then
    bw_of allreduce_big allreduce "$BIGB" 1
    if [ "$BIGB" = $TARGET_BIG ]; then
      target_line "allreduce $BIGB B busbw (GB/s)" "$H" "$M" ge 4 "$A"
    else
      cmp_line "allreduce $BIGB B busbw (GB/s)" "$H" "$M" "" "" "$A"
    fi
  fi
  bw_row allgather allgather $REFB 0.5 1.5
  bw_row broadcast bcast $REFB 1 1.2
  echo "# targets: $MET met, $MISSED missed, $NA n/a"
  # Same 8 B latency with and without HCOMM_TRANSPORT=tcp: the default run most likely used TCP.
  same=$(ratio "$(hc pingpong 8 6)" "$(hc tcp_pingpong 8 6)")
  if [ "$same" != n/a ] && awk -v r="$same" 'BEGIN { exit !(r > 0.85 && r < 1.15) }'; then
    echo "# NOTE: hcomm's 8 B pingpong takes about as long as with HCOMM_TRANSPORT=tcp (ratio $same):"
    echo "# hcomm most likely ran over TCP loopback here, not shared memory"
  fi
  if [ $TCPREF = 1 ]; then
    echo "#"
    echo "# reference: hcomm with HCOMM_TRANSPORT=tcp (TCP over loopback, heap buffers, same pinning)"
    echo "# against the same Open MPI (shared memory) numbers; no targets"
    cmp_line "TCP pingpong 8 B half-RTT (us)" "$(hc tcp_pingpong 8 6)" "$(mpi pingpong_ompi pingpong 8 4)"
    cmp_line "TCP allreduce $REFB B busbw (GB/s)" "$(gbps $REFB "$(hc tcp_allreduce $REFB 6)")" \
      "$(gbps $REFB "$(mpi allreduce_ompi allreduce $REFB 4)")" "" "" "$(hc tcp_allreduce $REFB 10)"
  fi
  if [ $OVER = 1 ]; then
    echo "#"
    echo "# $OVER_NP ranks on $(nproc) cores, oversubscribed, unpinned; hcomm: its defaults, buffers ${BUFS:-heap};"
    echo "# Open MPI: its defaults (mpirun.openmpi --oversubscribe -np $OVER_NP, no MCA settings); no target"
    cmp_line "allreduce $MIB B time, $OVER_NP ranks (us)" "$(hc over_allreduce $MIB 6)" \
      "$(mpi over_allreduce_ompi allreduce $MIB 4)" "" "" "$(hc over_allreduce $MIB 10)"
  fi
  raw_tables "hcomm_perf" pingpong allreduce allreduce_big broadcast allgather
  raw_tables "hcomm_perf (HCOMM_TRANSPORT=tcp)" tcp_pingpong tcp_allreduce
  raw_tables "hcomm_perf ($OVER_NP ranks, unpinned)" over_allreduce
  raw_tables "Open MPI mpi_bench (btl vader,self, cma)" pingpong_ompi allreduce_ompi \
    allreduce_big_ompi broadcast_ompi allgather_ompi
  raw_tables "Open MPI mpi_bench (defaults, $OVER_NP ranks)" over_allreduce_ompi
} >"$SUMMARY"
sed -n '/^# 2 ranks/,/^# ----/p' "$SUMMARY" | sed '/^$/d; /^# ----/d'
echo "summary: $SUMMARY"
if [ -n "$(failed_runs)" ]; then
  echo "$NAME: some runs failed (see the # FAILED and # run lines of the summary)" >&2
  exit 1
fi
