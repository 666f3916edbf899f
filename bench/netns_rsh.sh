#!/bin/sh
# netns_rsh.sh - stand-in for ssh used by mpirun's rsh launcher (--mca plm_rsh_agent):
# "ssh [opts] HOST CMD..." -> run CMD in the network namespace that owns HOST, pinned to
# that "host's" core. The two hosts come from the environment p2p_tcp.sh exports:
#   P2P_NS_A P2P_IP_A P2P_CPU_A   and   P2P_NS_B P2P_IP_B P2P_CPU_B
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
if [ -n "${P2P_IP_A:-}" ] && [ "$host" = "$P2P_IP_A" ]; then
  ns=$P2P_NS_A cpu=${P2P_CPU_A:-0}
elif [ -n "${P2P_IP_B:-}" ] && [ "$host" = "$P2P_IP_B" ]; then
  ns=$P2P_NS_B cpu=${P2P_CPU_B:-1}
else
  echo "netns_rsh.sh: unknown host '$host' (P2P_IP_A=${P2P_IP_A:-unset} P2P_IP_B=${P2P_IP_B:-unset})" >&2
  exit 255
fi
exec ip netns exec "$ns" taskset -c "$cpu" /bin/sh -c "$*"
