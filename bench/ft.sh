#!/usr/bin/env bash
# ft.sh - what going on without a lost rank costs, against aborting and starting the job again.
# For each N in NS and each layout in HOSTS, ROUNDS rounds of, interleaved:
#   ft     examples/ft_bench.rs with FT_MODE=ft on N ranks: the last rank kills itself
#          (SIGKILL) while the others all-reduce 8 bytes; the survivors detect the loss, revoke
#          (rank 0, the others blocked in a receive), agree, shrink and all-reduce on the
#          shrunk communicator, one phase after the other;
#   fresh  FT_MODE=fresh on N-1 ranks: a fresh job of the survivors (launch, init, one
#          all-reduce), the cost of "abort and start again" once the failure is known.
# Per round (milliseconds, from the ranks' wall clocks):
#   detect   kill -> the last survivor's all-reduce fails
#   known    kill -> the last survivor's failed() names the victim
#   revoke   rank 0 calls revoke -> the last blocked survivor fails with Revoked
#   agree    the last survivor enters agree -> the last one returns (shrink alike)
#   first    the last shrink returns -> the last first all-reduce on the shrunk comm returns
#   recover  the last survivor's error -> its first all-reduce on the shrunk communicator
#            (revoke + agree + shrink + first, with the little synchronisation between them)
#   total    kill -> the last first all-reduce on the shrunk communicator
#   restart  launch of the fresh job -> its last first all-reduce, of which
#   spawn    launch -> the last rank's process runs, and
#   init     the last rank's start -> the last init returns
# then the medians; the summary goes to results/ft_summary.txt.
#
# HOSTS=1: one host, hcommrun (--keep-going for ft). HOSTS=2: two simulated hosts (network
# namespaces hcf_h0 and hcf_h1, 10.80.0.1 and .2 on a veth pair, common.sh's ns_up), ranks 0..N/2-1
# on the first, the rest on the second (the victim, the last rank, on the second), each rank
# started by hand in its namespace (HCOMM_HOST_ID=host<h>, rank 0 hosting the store): ranks of
# a host use shared memory, the others TCP. Needs root for HOSTS=2.
#
# Usage: [NS="4 8"] [HOSTS="1 2"] [ROUNDS=5] bench/ft.sh
# Needs: cargo build --release -p hcomm-tools --bins --examples. RUN_TIMEOUT (default 120 s)
# bounds each job; HCOMM_TIMEOUT defaults to 30; SUMMARY names the summary file.
set -euo pipefail
NS=${NS:-4 8}
HOSTS=${HOSTS:-1 2}
ROUNDS=${ROUNDS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-120}
export HCOMM_TIMEOUT=${HCOMM_TIMEOUT:-30}
# common.sh: HERE, ROOT, the two namespaces (ns_up) and their removal (cleanup).
. "$(dirname "$0")/common.sh"
BIN=${HCOMM_BIN:-$ROOT/target/release}
PROG=$BIN/examples/ft_bench
SUMMARY=${SUMMARY:-$HERE/results/ft_summary.txt}
work=$(mktemp -d)
LOG=$work/log LOCAL=1 PIDS=()
NSA=hcf_h0 NSB=hcf_h1 IF=hcf0 IPA=10.80.0.1 IPB=10.80.0.2
finish() {
    cleanup
    rm -rf "$work"
}
trap finish EXIT
trap 'exit 130' INT TERM
[ -x "$PROG" ] && [ -x "$BIN/hcommrun" ] || {
    echo "ft.sh: build first: cargo build --release -p hcomm-tools --bins --examples" >&2
    exit 2
}

# run_job MODE N LAYOUT SPLIT: N ranks of ft_bench in MODE, output (lines "[rank] key value")
# in $work/out; SPLIT is how many ranks the first host gets (LAYOUT 2). Prints the launch time.
run_job() {
    local mode=$1 n=$2 layout=$3 split=$4 launch
    launch=$(date +%s%N)
    if [ "$layout" = 1 ]; then
        local opt=()
        [ "$mode" = ft ] && opt=(--keep-going)
        FT_MODE=$mode timeout "$RUN_TIMEOUT" "$BIN/hcommrun" -n "$n" "${opt[@]}" -- "$PROG" \
            >"$work/out" 2>&1 || true
    else
        local port secret r h pids=()
        port=$(store_port)
        secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
        for r in $(seq 0 $((n - 1))); do
            h=$((r < split ? 0 : 1))
            # In a subshell that outlives the rank: the victim's SIGKILL is not reported.
            (ip netns exec "$([ $h = 0 ] && echo "$NSA" || echo "$NSB")" env FT_MODE="$mode" \
                HCOMM_RANK="$r" HCOMM_SIZE="$n" HCOMM_ROOT_ADDR="$IPA:$port" \
                HCOMM_JOB_SECRET="$secret" HCOMM_HOST_ID="host$h" \
                timeout "$RUN_TIMEOUT" "$PROG" 2>&1 || true) 2>/dev/null | sed -u "s/^/[$r] /" >"$work/out.$r" &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || true; done
        cat "$work"/out.* >"$work/out"
        rm -f "$work"/out.*
    fi
    echo "$launch"
}

# The latencies of an ft job's output, in ms: "detect known revoke agree shrink first recover
# total" ("-" for each when a phase is missing).
ft_latencies() {
    sed 's/^\[[0-9]*\] //' "$work/out" | awk '
        function mx(k, v) { if (!(k in M) || v > M[k]) M[k] = v }
        $1 ~ /^(kill|error|known|revoke|revoked|agree_in|agree_out|shrink_in|shrink_out|first)$/ {
            mx($1, $2)
        }
        function ms(a, b) { return (a in M && b in M) ? sprintf("%.3f", (M[b] - M[a]) / 1e6) : "-" }
        END {
            print ms("kill", "error"), ms("kill", "known"), ms("revoke", "revoked"), ms("agree_in", "agree_out"),
                ms("shrink_in", "shrink_out"), ms("shrink_out", "first"), ms("error", "first"),
                ms("kill", "first")
        }'
}

# The fresh job's latencies in ms: "restart spawn init": launch -> the last rank's first
# all-reduce; launch -> the last rank's start; the last start -> the last init's return.
restart_latency() {
    sed 's/^\[[0-9]*\] //' "$work/out" | awk -v launch="$1" '
        $1 ~ /^(start|init|first)$/ && $2 > M[$1] { M[$1] = $2 }
        function ms(a, b) { return (a && b) ? sprintf("%.3f", (b - a) / 1e6) : "-" }
        END { print ms(launch, M["first"]), ms(launch, M["start"]), ms(M["start"], M["init"]) }'
}

median() { grep -v '^-$' | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }

COLS="detect known revoke agree shrink first recover total restart spawn init"
{
    echo "# bench/ft.sh: NS=\"$NS\" HOSTS=\"$HOSTS\" ROUNDS=$ROUNDS, $(nproc) cores, $(date -u '+%F %H:%M UTC')"
    echo "# load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$work/summary"
for layout in $HOSTS; do
    if [ "$layout" = 2 ] && [ "$LOCAL" = 1 ]; then
        LOCAL=0
        ns_up
    fi
    for n in $NS; do
        half=$((n / 2))
        : >"$work/rows"
        echo "## N=$n HOSTS=$layout (ms): round $COLS" | tee -a "$work/summary"
        for round in $(seq 1 "$ROUNDS"); do
            run_job ft "$n" "$layout" "$half" >/dev/null
            ft=$(ft_latencies)
            if ! grep -q '^\[[0-9]*\] first' "$work/out"; then
                echo "round $round: the ft job failed:" >&2
                grep -v '^\[[0-9]*\] [a-z_]* [0-9]' "$work/out" | head -8 >&2 || true
            fi
            launch=$(run_job fresh $((n - 1)) "$layout" "$half")
            restart=$(restart_latency "$launch")
            echo "round $round $ft $restart" | tee -a "$work/summary"
            echo "$ft $restart" >>"$work/rows"
        done
        meds=""
        for c in $(seq 1 11); do meds="$meds $(awk -v c="$c" '{ print $c }' "$work/rows" | median)"; done
        echo "median$meds" | tee -a "$work/summary"
    done
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$work/summary"
mkdir -p "$(dirname "$SUMMARY")"
cp "$work/summary" "$SUMMARY"
