#!/usr/bin/env bash
# startup.sh - start-up of large jobs: ROUNDS launches in a row of N ranks each of
#   hcomm    examples/startup.rs (init, an all-reduce, a barrier, finalize)
#   ompi     a trivial MPI_Init/MPI_Barrier/MPI_Finalize program under Open MPI's mpirun
# interleaved, so that both see the same machine. Prints per launch: whether it succeeded,
# its wall time, and for hcomm the slowest rank's init and finalize; then the counts of
# successes and the median wall times.
#
# HOSTS=1 (default): one host; hcommrun -n N, and mpirun --oversubscribe -n N.
# HOSTS=H > 1: N ranks over H simulated hosts, N/H each, rank r on host r / (N/H) for both.
#   Each host is a network namespace (hcs_h0 .. hcs_h<H-1>, 10.79.0.<h+1>/24 on a veth whose
#   other end is on a bridge in the namespace hcs_br), so that ranks of different hosts talk
#   TCP over the veths and ranks of one host shared memory. hcomm: the ranks of host h are
#   started in hcs_h<h> with HCOMM_RANK/SIZE, HCOMM_HOST_ID=host<h>, HCOMM_ROOT_ADDR=10.79.0.1
#   and a random port (rank 0 hosts the store there) and a fresh HCOMM_JOB_SECRET. Open MPI:
#   mpirun in hcs_h0 with --host 10.79.0.1:N/H,...,  its rsh launcher reaching the other
#   namespaces through netns_rsh.sh (an ssh stand-in), TCP restricted to 10.79.0.0/24, each
#   host with its own hostname (a UTS namespace; Open MPI names its shared-memory segments
#   after it). The namespaces are removed on exit. Needs root.
#
# Usage: [N=128] [ROUNDS=10] [MPI=1] [HOSTS=1] bench/startup.sh   (MPI=0: hcomm only)
# Needs: cargo build --release -p hcomm-tools --bins --examples; for MPI=1, mpicc and mpirun
# (Open MPI; as root it sets OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1).
# RUN_TIMEOUT (default 300 s) bounds each launch.
set -euo pipefail
N=${N:-128}
ROUNDS=${ROUNDS:-10}
MPI=${MPI:-1}
HOSTS=${HOSTS:-1}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
BIN="$ROOT/target/release"
work=$(mktemp -d)
NETS=()
cleanup() {
    local ns
    for ns in ${NETS[@]+"${NETS[@]}"}; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
if [ "$MPI" = 1 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    printf '#include <mpi.h>\nint main(int c, char **v) { MPI_Init(&c, &v); MPI_Barrier(MPI_COMM_WORLD); MPI_Finalize(); return 0; }\n' >"$work/init.c"
    mpicc -O2 -o "$work/init" "$work/init.c"
fi

# ---- simulated hosts -------------------------------------------------------------
if [ "$HOSTS" -gt 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "startup.sh: HOSTS>1 needs root (network namespaces)" >&2; exit 1; }
    [ $((N % HOSTS)) = 0 ] || { echo "startup.sh: N=$N is not a multiple of HOSTS=$HOSTS" >&2; exit 2; }
    PER=$((N / HOSTS))
    ip netns del hcs_br 2>/dev/null || true
    ip netns add hcs_br
    NETS+=(hcs_br)
    ip -n hcs_br link add hcs_br0 type bridge
    ip -n hcs_br link set hcs_br0 up
    host_list=() rsh_hosts=()
    for h in $(seq 0 $((HOSTS - 1))); do
        ns=hcs_h$h ip=10.79.0.$((h + 1))
        ip netns del "$ns" 2>/dev/null || true
        ip netns add "$ns"
        NETS+=("$ns")
        ip link add "hcs_v$h" netns "$ns" type veth peer name "hcs_p$h" netns hcs_br
        ip -n hcs_br link set "hcs_p$h" master hcs_br0
        ip -n hcs_br link set "hcs_p$h" up
        ip -n "$ns" addr add "$ip/24" dev "hcs_v$h"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "hcs_v$h" up
        host_list+=("$ip:$PER")
        rsh_hosts+=("$ip=$ns")
    done
    export NETNS_HOSTS="${rsh_hosts[*]}"
    echo "# $HOSTS hosts (namespaces hcs_h0..hcs_h$((HOSTS - 1)), 10.79.0.1..$HOSTS on a bridge), $PER ranks each"
fi

# hcomm_hosts: the hcomm job over the namespaces (each rank under `timeout RUN_TIMEOUT`);
# fails when a rank fails.
hcomm_hosts() {
    local port=$((20000 + RANDOM % 12000)) secret h pids=() rc=0
    secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for h in $(seq 0 $((HOSTS - 1))); do
        ip netns exec "hcs_h$h" env HCOMM_SIZE="$N" HCOMM_ROOT_ADDR="10.79.0.1:$port" \
            HCOMM_JOB_SECRET="$secret" HCOMM_HOST_ID="host$h" FIRST=$((h * PER)) PER="$PER" \
            PROG="$BIN/examples/startup" LIMIT="$RUN_TIMEOUT" bash -c '
                pids=()
                for r in $(seq "$FIRST" $((FIRST + PER - 1))); do
                    HCOMM_RANK=$r timeout "$LIMIT" "$PROG" &
                    pids+=($!)
                done
                rc=0
                for p in "${pids[@]}"; do wait "$p" || rc=$?; done
                exit $rc' &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    return $rc
}

# The launch commands of both.
if [ "$HOSTS" -gt 1 ]; then
    hcomm_cmd=(hcomm_hosts)
    hosts_arg=$(IFS=,; echo "${host_list[*]}")
    # Each host has its own hostname (a UTS namespace, here and in netns_rsh.sh): Open MPI
    # names its session directories and shared-memory segments after it.
    ompi_cmd=(timeout "$RUN_TIMEOUT" ip netns exec hcs_h0 unshare --uts
        bash -c 'hostname hcs-h0 && exec "$@"' _ mpirun -n "$N" --host "$hosts_arg"
        --mca plm rsh --mca plm_rsh_agent "$HERE/netns_rsh.sh"
        --mca btl self,vader,tcp --mca btl_tcp_if_include 10.79.0.0/24
        --mca oob_tcp_if_include 10.79.0.0/24 --bind-to none "$work/init")
else
    hcomm_cmd=(timeout "$RUN_TIMEOUT" "$BIN/hcommrun" -n "$N" -- "$BIN/examples/startup")
    ompi_cmd=(timeout "$RUN_TIMEOUT" mpirun --oversubscribe -n "$N" "$work/init")
fi

# wall CMD...: runs CMD with its output in $work/out, prints "rc seconds".
wall() {
    local t0 t1 rc=0
    t0=$(date +%s.%N)
    "$@" >"$work/out" 2>&1 || rc=$?
    t1=$(date +%s.%N)
    echo "$rc $(echo "$t1 - $t0" | bc)"
}
# The largest value of a "name value" pair over the ranks' lines.
slowest() { grep -o "$1 [0-9.]*" "$work/out" | awk -v m=0 '{ if ($2 > m) m = $2 } END { print m }'; }
median() { sort -n | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "-" }'; }

: >"$work/hcomm" >"$work/ompi"
ok_h=0 ok_o=0
echo "# N=$N HOSTS=$HOSTS ROUNDS=$ROUNDS, load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$ROUNDS"); do
    read -r rc secs < <(wall "${hcomm_cmd[@]}")
    lines=$(grep -c 'init_ms' "$work/out" || true)
    if [ "$rc" = 0 ] && [ "$lines" = "$N" ]; then
        ok_h=$((ok_h + 1))
        echo "$secs" >>"$work/hcomm"
        echo "round $round hcomm ok ${secs}s slowest init $(slowest init_ms) ms finalize $(slowest finalize_ms) ms"
    else
        echo "round $round hcomm FAILED (rc $rc, $lines of $N ranks done) ${secs}s:"
        grep -v init_ms "$work/out" | head -5 || true
    fi
    if [ "$MPI" = 1 ]; then
        read -r rc secs < <(wall "${ompi_cmd[@]}")
        if [ "$rc" = 0 ]; then
            ok_o=$((ok_o + 1))
            echo "$secs" >>"$work/ompi"
            echo "round $round ompi  ok ${secs}s"
        else
            echo "round $round ompi  FAILED (rc $rc) ${secs}s:"
            head -5 "$work/out" || true
        fi
    fi
done
echo "# load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "N=$N HOSTS=$HOSTS: hcomm $ok_h of $ROUNDS succeeded, median wall $(median <"$work/hcomm") s"
if [ "$MPI" = 1 ]; then
    echo "N=$N HOSTS=$HOSTS: ompi  $ok_o of $ROUNDS succeeded, median wall $(median <"$work/ompi") s"
fi
