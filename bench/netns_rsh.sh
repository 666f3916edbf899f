#!/bin/sh
# netns_rsh.sh - stand-in for ssh used by mpirun's rsh launcher (--mca plm_rsh_agent):
# "ssh [opts] HOST CMD..." -> run CMD in the network namespace that owns HOST. The hosts come
# from the environment:
#   P2P_NS_A P2P_IP_A P2P_CPU_A   and   P2P_NS_B P2P_IP_B P2P_CPU_B   (p2p_tcp.sh: two hosts,
#                                                                    each pinned to its core)
#   NETNS_HOSTS="IP=NS IP=NS ..."                                    (startup.sh HOSTS=H: any
#                                                                    number, unpinned, each
#                                                                    with hostname NS, _ -> -)
while [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done
host=$1
shift
for pair in ${NETNS_HOSTS:-}; do
  if [ "${pair%%=*}" = "$host" ]; then
    exec ip netns exec "${pair#*=}" unshare --uts /bin/sh -c "hostname $(echo "${pair#*=}" | tr _ -) && $*"
  fi
done
if [ -n "${P2P_IP_A:-}" ] && [ "$host" = "$P2P_IP_A" ]; then
  ns=$P2P_NS_A cpu=${P2P_CPU_A:-0}
elif [ -n "${P2P_IP_B:-}" ] && [ "$host" = "$P2P_IP_B" ]; then
  ns=$P2P_NS_B cpu=${P2P_CPU_B:-1}
else
  echo "netns_rsh.sh: unknown host '$host' (P2P_IP_A=${P2P_IP_A:-unset} P2P_IP_B=${P2P_IP_B:-unset} NETNS_HOSTS=${NETNS_HOSTS:-unset})" >&2
  exit 255
fi
exec ip netns exec "$ns" taskset -c "$cpu" /bin/sh -c "$*"
