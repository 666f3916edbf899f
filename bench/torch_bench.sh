#!/usr/bin/env bash
# torch.distributed benchmark (bench/torch_bench.py): hcomm against Gloo in the same jobs, on
# 2 and 4 local ranks, then (as root, with iproute2) DDP over two simulated hosts: network
# namespaces joined by a bridge, 2 ranks each, as python/tests/test_torch.py's two-host test
# lays them out. The tables go to bench/results/torch_summary.txt, the numbers to
# bench/results/torch_<n>.json and torch_2x2_netns.json. PYTHON: the interpreter with torch
# and hcomm (.venv/bin/python); NETNS=0 leaves the two-host part out; extra arguments go to
# every bench/torch_bench.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=bench/results/torch_summary.txt
filter() { grep -v -e '^\*' -e 'OMP_NUM_THREADS' -e '^$' -e 'socket.cpp' || true; }
load() { echo "# load average $(cut -d' ' -f1-3 /proc/loadavg) at $(date -u '+%H:%M UTC')"; }

netns_ddp() {
    local job="htb$$" port=29477
    local h0="$job-h0" h1="$job-h1"
    trap 'ip netns del "$h0" 2>/dev/null || true; ip netns del "$h1" 2>/dev/null || true' RETURN
    for h in "$h0" "$h1"; do
        ip netns add "$h"
        ip -n "$h" link set lo up
    done
    ip -n "$h0" link add br0 type bridge
    ip -n "$h0" addr add 10.79.0.1/24 dev br0
    ip -n "$h0" link set br0 up
    ip link add h1 netns "$h0" type veth peer name eth0 netns "$h1"
    ip -n "$h0" link set h1 master br0
    ip -n "$h0" link set h1 up
    ip -n "$h1" addr add 10.79.0.2/24 dev eth0
    ip -n "$h1" link set eth0 up
    local pids=() i
    for i in 0 1; do
        local h=$h0 ifname=br0
        [[ $i == 1 ]] && h=$h1 ifname=eth0
        OMP_NUM_THREADS=1 HCOMM_HOST_ID=$h GLOO_SOCKET_IFNAME=$ifname \
            ip netns exec "$h" "$PYTHON" -m torch.distributed.run --nnodes 2 --node-rank "$i" \
            --nproc-per-node 2 --master-addr 10.79.0.1 --master-port "$port" \
            bench/torch_bench.py --parts latency,ddp --label "(2 simulated hosts x 2)" \
            --json bench/results/torch_2x2_netns.json "$@" > "$out.netns$i" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    filter < "$out.netns0"
    [[ $rc == 0 ]] || { echo "two-host job failed:"; tail -20 "$out.netns0" "$out.netns1"; }
    rm -f "$out.netns0" "$out.netns1"
}

{
    echo "# bench/torch_bench.sh $*, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores;" \
        "the host is shared with other jobs: see the load averages"
    for n in 2 4; do
        load
        OMP_NUM_THREADS=1 "$PYTHON" -m torch.distributed.run --nproc-per-node "$n" \
            --standalone bench/torch_bench.py --json "bench/results/torch_$n.json" "$@" \
            2>&1 | filter
    done
    if [[ ${NETNS:-1} != 0 && $(id -u) == 0 ]] && ip -V > /dev/null 2>&1; then
        load
        netns_ddp "$@"
    fi
    load
} | tee "$out.tmp"
mv "$out.tmp" "$out"
