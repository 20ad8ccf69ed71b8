#!/usr/bin/env bash
# "Nodes" on this machine, each a network namespace with its own address on a private bridge, so
# that a multi-node run's rendezvous and collectives cross a real network interface.
#
#   deploy/nodes/local-nodes.sh up [N]   N namespaces (default 2) NAME0..N-1, addresses PREFIX.1..N
#   deploy/nodes/local-nodes.sh env      the `export TP_LOCAL_NODES=...` line the local launcher reads
#   deploy/nodes/local-nodes.sh status   each node, its address, and whether node0 reaches it
#   deploy/nodes/local-nodes.sh down     remove exactly what `up` made (the namespaces and the bridge)
#
# Root only (network namespaces). The bridge NAMEs holds PREFIX.254, so a node reaches services of this
# machine there; each node's /etc/hosts names every node and this machine (/etc/netns/NS/hosts).
# TP_NODES_NAME (default tp-node) and TP_NODES_PREFIX (default 10.77.0, the /24) tell sets of nodes apart:
# each set's commands touch only its own. Every node's interface is named tp0 inside its namespace:
# GLOO_SOCKET_IFNAME=tp0 (NCCL_SOCKET_IFNAME on GPUs) is the same on each.
set -euo pipefail

PREFIX="${TP_NODES_PREFIX:-10.77.0}"
NAME="${TP_NODES_NAME:-tp-node}"
BRIDGE="${NAME}s"
LOG_NAME=local-nodes
WAIT_SECONDS="${TP_NODES_WAIT_SECONDS:-10}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

[[ "$PREFIX" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "TP_NODES_PREFIX=$PREFIX: give three octets, e.g. 10.77.0"
# Interface names have 15 characters at most: NAMEs (the bridge) and NAMEv<i> (a node's end on it).
[[ "$NAME" =~ ^[a-z][a-z0-9-]{0,9}$ ]] || die "TP_NODES_NAME=$NAME: 1-10 lower-case letters, digits or '-', e.g. tp-node"

# reachable I: node0 reaches node I (a connection to a closed port is refused, not left unanswered;
# nothing to install: the machine may have no ping).
reachable() {
    local said
    said=$(ip netns exec "${NAME}0" timeout 2 bash -c "exec 3<>/dev/tcp/$PREFIX.$(($1 + 1))/9" 2>&1 || true)
    [[ "$said" == *refused* ]]
}

nodes() { ip netns list | awk '{print $1}' | grep -E "^$NAME[0-9]+\$" | sort -V || true; }

node_env() {
    local spec="" ns i
    for ns in $(nodes); do
        i="${ns#"$NAME"}"
        spec+="${spec:+,}$ns=$PREFIX.$((i + 1))"
    done
    [[ -n "$spec" ]] || die "no nodes are up; run: $0 up 2"
    echo "export TP_LOCAL_NODES=$spec"
}

# Each node's /etc/hosts (ip netns exec mounts /etc/netns/NS/hosts over it): every node by name, and this
# machine by its own name at the bridge's address, so that a node's daemons reach a controller here.
write_hosts() {
    local ns j
    for ns in $(nodes); do
        mkdir -p "/etc/netns/$ns"
        {
            echo "127.0.0.1 localhost"
            echo "$PREFIX.254 $(hostname) $(hostname -s)"
            for j in $(nodes); do echo "$PREFIX.$((${j#"$NAME"} + 1)) $j"; done
        } >"/etc/netns/$ns/hosts"
    done
}

up() {
    local count="${1:-2}" i ns
    [[ "$count" =~ ^[0-9]+$ && "$count" -ge 1 && "$count" -le 250 ]] || die "up N: N is a number of nodes, 1-250"
    [[ $EUID -eq 0 ]] || die "network namespaces need root; run as root"
    command -v ip >/dev/null || die "the ip command (iproute2) is missing; apt-get install iproute2"
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$PREFIX.254/24" dev "$BRIDGE"
        ip link set "$BRIDGE" up
    fi
    for ((i = 0; i < count; i++)); do
        ns="$NAME$i"
        if ip netns list | grep -qx "$ns\( .*\)\?"; then continue; fi
        ip netns add "$ns"
        ip link add "${NAME}v$i" type veth peer name tp0 netns "$ns"
        ip link set "${NAME}v$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$PREFIX.$((i + 1))/24" dev tp0
        ip -n "$ns" link set tp0 up
        ip -n "$ns" link set lo up
    done
    write_hosts
    for ((i = 1; i < count; i++)); do
        wait_for "$NAME$i reachable from ${NAME}0" reachable "$i" \
            || die "$NAME$i ($PREFIX.$((i + 1))) does not answer ${NAME}0; is bridged traffic filtered (br_netfilter)?"
    done
    node_env
}

status() {
    local ns i reach
    for ns in $(nodes); do
        i="${ns#"$NAME"}"
        reach=$(reachable "$i" && echo reachable || echo unreachable)
        echo "$ns $PREFIX.$((i + 1)) $reach"
    done
}

down() {
    local ns i
    for ns in $(nodes); do
        i="${ns#"$NAME"}"
        # Whatever still runs in a node goes with it: a namespace outlives ip netns del while it has processes.
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
        ip link del "${NAME}v$i" 2>/dev/null || true
        ip netns del "$ns"
        rm -rf "/etc/netns/$ns"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE"; fi
    log "down"
}

case "${1:-}" in
    up) up "${2:-2}" ;;
    env) node_env ;;
    status) status ;;
    down) down ;;
    *) die "usage: $0 up [N] | env | status | down" ;;
esac
