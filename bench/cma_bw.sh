#!/usr/bin/env bash
# cma_bw.sh: cma_bw.c on both cores at once (CPU 0 and 1, chrt -f 10), as the two ranks of a
# pinned 2-rank run load the memory system; the modes and sizes that explain the heap
# all-reduce at 256 MiB (docs/tuning.md#heap-buffers-at-256-mib). Run it inside flock /work/bench.lock
# on a shared machine.
#   usage: cma_bw.sh [-r REPS] [-s "MIB ..."] [-m "MODE ..."] [-p "PAGES ..."] [-c CHUNK_KIB]
#   defaults: REPS 5, MIB "8 128" (per core: the half of a 16 MiB and of a 256 MiB all-reduce),
#   MODE "read memcpy nt nt64 readv_copy readv readv_hot writev writev_hot reduce allreduce pool allgather
#   allgather64", PAGES 4k, chunk 128
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPS=5 SIZES="8 128" CHUNK=128 PAGES=4k
MODES="read memcpy nt nt64 readv_copy readv readv_hot writev writev_hot reduce allreduce pool allgather allgather64"
while getopts "r:s:m:p:c:" o; do
  case $o in
    r) REPS=$OPTARG ;; s) SIZES=$OPTARG ;; m) MODES=$OPTARG ;; p) PAGES=$OPTARG ;; c) CHUNK=$OPTARG ;;
    *) sed -n 2,9p "$0"; exit 2 ;;
  esac
done
BIN=$HERE/build/cma_bw
mkdir -p "$HERE/build"
[ "$BIN" -nt "$HERE/cma_bw.c" ] || gcc -O2 -Wall -o "$BIN" "$HERE/cma_bw.c"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# cma_bw.sh on $(hostname), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
for s in $SIZES; do
  for p in $PAGES; do
    for m in $MODES; do
      chrt -f 10 taskset -c 0 "$BIN" "$m" "$s" "$CHUNK" "$p" "$REPS" >"$out/0" &
      chrt -f 10 taskset -c 1 "$BIN" "$m" "$s" "$CHUNK" "$p" "$REPS" >"$out/1"
      wait
      sed 's/^/cpu0 /' "$out/0"
      sed 's/^/cpu1 /' "$out/1"
    done
  done
done
