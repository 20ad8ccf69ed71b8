#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for tests and local use.
#
#   deploy/slurm/local-cluster.sh up [--nodes N]   install (as root) if missing, configure, start, wait for idle
#   deploy/slurm/local-cluster.sh status   what runs, and the nodes' state
#   deploy/slurm/local-cluster.sh down     stop exactly the daemons `up` started (pid files)
#   deploy/slurm/local-cluster.sh fail-node tp-nodeK   kill a namespace node as a power loss would (`up` restarts it)
#
# One node, named after this machine, holds the `spot` and `ondemand` partitions. With --nodes N (N >= 2,
# root) the cluster also has N nodes tp-node0..N-1, each a slurmd in its own network and UTS namespace
# (deploy/nodes/local-nodes.sh: its own hostname and address on a bridge), in partitions `nodes` and
# `nodes-spot` (preempted by `nodes`, like spot by ondemand): a multi-node job's rendezvous and collectives
# cross a real network interface.
#
# Everything lives under $TP_SLURM_DIR (default /tmp/tp-slurm): etc/ (slurm.conf, gres.conf),
# state/, run/ (pid files), log/, gpus/ (plain files standing in for GPUs). Clients find the
# config through SLURM_CONF=$TP_SLURM_DIR/etc/slurm.conf; when /etc/slurm/slurm.conf is free,
# `up` also links it there so plain `sbatch` works.
set -euo pipefail

DIR="${TP_SLURM_DIR:-/tmp/tp-slurm}"
GPUS="${TP_SLURM_GPUS:-4}"
SPOT_GRACE_SECONDS="${TP_SLURM_SPOT_GRACE:-10}"
SLURMD_TIMEOUT="${TP_SLURM_SLURMD_TIMEOUT:-30}"  # a node not answering this long is DOWN, its jobs requeued
REQUEUE_HOLD_SECONDS="${TP_SLURM_REQUEUE_HOLD:-120}"  # a requeued job waits this long to start (cred_expire)
WAIT_SECONDS="${TP_SLURM_WAIT_SECONDS:-60}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCAL_NODES="$HERE/../nodes/local-nodes.sh"
NODES_PREFIX="${TP_NODES_PREFIX:-10.77.0}"
TEMPLATE="$HERE/slurm.conf.template"
CONF="$DIR/etc/slurm.conf"
HOST="$(hostname -s)"
export SLURM_CONF="$CONF"

LOG_NAME=local-cluster
STOP_SECONDS="$WAIT_SECONDS"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v sbatch >/dev/null; then
        return
    fi
    [[ $EUID -eq 0 ]] || die "slurm-wlm and munge are not installed; run as root to install them (apt-get)"
    log "installing slurm-wlm and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm munge >"$DIR/log/apt.log" 2>&1 || {
        apt-get update -q >>"$DIR/log/apt.log" 2>&1
        apt-get install -y -q slurm-wlm munge >>"$DIR/log/apt.log" 2>&1
    } || die "apt-get install slurm-wlm munge failed; see $DIR/log/apt.log"
}

write_config() {
    local cpus mem
    # Node CPUs and RealMemory must not exceed what slurmd detects, or the node stays drained.
    read -r cpus mem < <(slurmd -C | awk '/^NodeName/ {
        for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        print v["CPUs"], v["RealMemory"] }')
    [[ -n "$cpus" && -n "$mem" ]] || die "could not read CPUs/RealMemory from 'slurmd -C'"
    mkdir -p "$DIR/etc" "$DIR/state/ctld" "$DIR/state/slurmd" "$DIR/run" "$DIR/log" "$DIR/gpus"
    sed -e "s|@CLUSTER_NAME@|tp-local|g" -e "s|@HOST@|$HOST|g" \
        -e "s|@CTLD_PORT@|${TP_SLURM_CTLD_PORT:-6817}|g" -e "s|@SLURMD_PORT@|${TP_SLURM_SLURMD_PORT:-6818}|g" \
        -e "s|@STATE_DIR@|$DIR/state|g" -e "s|@RUN_DIR@|$DIR/run|g" -e "s|@LOG_DIR@|$DIR/log|g" \
        -e "s|@ACCOUNTING_STORAGE@|accounting_storage/none|g" \
        -e "s|@CPUS@|$cpus|g" -e "s|@REAL_MEMORY@|$((mem * 9 / 10))|g" -e "s|@GPUS@|$GPUS|g" \
        -e "s|@SPOT_GRACE_SECONDS@|$SPOT_GRACE_SECONDS|g" -e "s|@SLURMD_TIMEOUT@|$SLURMD_TIMEOUT|g" \
        -e "s|@REQUEUE_HOLD_SECONDS@|$REQUEUE_HOLD_SECONDS|g" "$TEMPLATE" >"$CONF.tmp"
    local count i
    count=$(namespace_nodes)
    if ((count > 1)); then
        for ((i = 0; i < count; i++)); do
            echo "NodeName=tp-node$i NodeAddr=$NODES_PREFIX.$((i + 1)) CPUs=$cpus RealMemory=$((mem * 9 / 10)) State=UNKNOWN"
        done >>"$CONF.tmp"
        echo "PartitionName=nodes Nodes=tp-node[0-$((count - 1))] PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE" \
            "State=UP" >>"$CONF.tmp"
        echo "PartitionName=nodes-spot Nodes=tp-node[0-$((count - 1))] PriorityTier=1 PreemptMode=REQUEUE" \
            "GraceTime=$SPOT_GRACE_SECONDS MaxTime=INFINITE State=UP" >>"$CONF.tmp"
    fi
    mv "$CONF.tmp" "$CONF"
    # Fake GPUs: gres.conf must name files that exist (a Count=-only line leaves the node drained).
    local i
    for ((i = 0; i < GPUS; i++)); do : >"$DIR/gpus/fakegpu$i"; done
    echo "NodeName=$HOST Name=gpu File=$DIR/gpus/fakegpu[0-$((GPUS - 1))]" >"$DIR/etc/gres.conf"
    cat >"$DIR/etc/cgroup.conf" <<EOF
CgroupPlugin=autodetect
EOF
    if [[ ! -e /etc/slurm/slurm.conf || "$(readlink /etc/slurm/slurm.conf)" == "$CONF" ]]; then
        mkdir -p /etc/slurm && ln -sfn "$CONF" /etc/slurm/slurm.conf
    else
        log "/etc/slurm/slurm.conf belongs to someone else; export SLURM_CONF=$CONF to use this cluster"
    fi
}

start_munge() {
    if alive "$DIR/run/munged.pid.ours"; then return; fi
    if pgrep -x munged >/dev/null; then
        log "munged already runs (not ours); using it"
        return
    fi
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
    munged --force --pid-file="$DIR/run/munged.pid.ours"
    wait_for "munged up" munge -n || die "munged did not start; see /var/log/munge/munged.log"
}

# How many namespace nodes this cluster has: `up --nodes N` records it (0: none).
namespace_nodes() { cat "$DIR/run/namespace-nodes" 2>/dev/null || echo 0; }

node_state() { sinfo -h -n "${1:-$HOST}" -o %T 2>/dev/null | head -n1; }

node_idle() { [[ "$(node_state "${1:-$HOST}")" == idle ]]; }

# A running cluster may be busy with jobs: allocated or mixed is as good as idle there.
node_usable() { [[ "$(node_state "${1:-$HOST}")" =~ ^(idle|mixed|allocated|completing)$ ]]; }

# start_slurmd NODE [NAMESPACE]: a slurmd for NODE, in NAMESPACE's network and a UTS namespace named NODE.
start_slurmd() {
    local node="$1" ns="${2:-}"
    if ! alive "$DIR/run/slurmd-$node.pid"; then
        if [[ -z "$ns" ]]; then
            slurmd -f "$CONF"
        else
            # Not `ip netns exec`: it mounts a sysfs of the namespace's own, without the cgroup tree slurmd reads.
            # The node's /etc/hosts (local-nodes.sh) is mounted over this machine's in a mount namespace of its own.
            nsenter --net="/run/netns/$ns" unshare --mount --uts sh -c "hostname $node \
                && mount --bind /etc/netns/$ns/hosts /etc/hosts && exec slurmd -f $CONF -N $node"
        fi
    fi
    if ! wait_for "node $node usable" node_usable "$node"; then
        # A node left down/drained by an earlier run comes back with an explicit resume.
        scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
        wait_for "node $node usable" node_usable "$node" \
            || die "node $node is '$(node_state "$node")', not usable after ${WAIT_SECONDS}s; see $DIR/log/slurmd-$node.log"
    fi
}

all_usable() {
    local i
    node_usable || return 1
    for ((i = 0; i < $(namespace_nodes); i++)); do
        alive "$DIR/run/slurmd-tp-node$i.pid" && node_usable "tp-node$i" || return 1
    done
}

# fail_node NODE: the node dies as a machine would, with no notice: SIGKILL to its slurmd and every process in its
# network namespace (the job steps and ranks there). `up` brings it back.
fail_node() {
    local node="$1" pids
    [[ "$node" =~ ^tp-node[0-9]+$ ]] && ip netns list | grep -qw "$node" \
        || die "fail-node NODE: NODE is one of this cluster's namespace nodes (tp-node0..), not '$node'"
    pids=$(ip netns pids "$node")
    if [[ -n "$pids" ]]; then kill -KILL $pids 2>/dev/null || true; fi
    log "$node failed: killed $(wc -w <<<"$pids") process(es); '$0 up' brings it back"
}

up() {
    local count="$1" i
    if [[ -z "$count" ]]; then  # as it runs, or this machine alone
        count=1
        if alive "$DIR/run/slurmctld.pid" && (($(namespace_nodes) > 1)); then count=$(namespace_nodes); fi
    fi
    [[ "$count" =~ ^[0-9]+$ && "$count" -ge 1 ]] || die "up --nodes N: N is a number of nodes (1: this machine alone)"
    ((count == 1)) && count=0
    mkdir -p "$DIR/log" "$DIR/run"
    install_packages
    if alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd-$HOST.pid" && scontrol ping >/dev/null 2>&1 \
        && ((count == $(namespace_nodes))) && all_usable; then
        log "already up (state in $DIR)"
        echo "SLURM_CONF=$CONF"
        return
    fi
    if ((count != $(namespace_nodes))) && alive "$DIR/run/slurmctld.pid"; then
        die "the cluster runs with $(namespace_nodes) namespace node(s), not $count; run '$0 down' first"
    fi
    if ((count > 1)); then
        [[ $EUID -eq 0 ]] || die "--nodes $count: namespace nodes need root"
        TP_NODES_PREFIX="$NODES_PREFIX" "$LOCAL_NODES" up "$count" >/dev/null
    fi
    echo "$count" >"$DIR/run/namespace-nodes"
    write_config
    start_munge
    alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF"
    wait_for "slurmctld up" scontrol ping || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
    start_slurmd "$HOST"
    for ((i = 0; i < count; i++)); do start_slurmd "tp-node$i" "tp-node$i"; done
    echo "SLURM_CONF=$CONF"
}

down() {
    # Jobs first: their steps would otherwise outlive slurmd as orphans.
    if alive "$DIR/run/slurmctld.pid"; then
        scancel --full --quiet --user=root >/dev/null 2>&1 || true
    fi
    local pidfile
    for pidfile in "$DIR"/run/slurmd-*.pid; do
        if [[ -e "$pidfile" ]]; then stop_pidfile slurmd "$pidfile"; fi
    done
    stop_pidfile slurmctld "$DIR/run/slurmctld.pid"
    stop_pidfile munged "$DIR/run/munged.pid.ours"
    if (($(namespace_nodes) > 1)); then TP_NODES_PREFIX="$NODES_PREFIX" "$LOCAL_NODES" down; fi
    rm -f "$DIR/run/namespace-nodes"
    if [[ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" == "$CONF" ]]; then rm -f /etc/slurm/slurm.conf; fi
}

status() {
    local name
    local nodes=("$HOST") i
    for ((i = 0; i < $(namespace_nodes); i++)); do nodes+=("tp-node$i"); done
    for name in munged.pid.ours slurmctld.pid; do
        if alive "$DIR/run/$name"; then echo "${name%%.*}: running (pid $(cat "$DIR/run/$name"))"
        else echo "${name%%.*}: not running (ours)"; fi
    done
    for name in "${nodes[@]}"; do
        if alive "$DIR/run/slurmd-$name.pid"; then echo "slurmd $name: running (pid $(cat "$DIR/run/slurmd-$name.pid"))"
        else echo "slurmd $name: not running (ours)"; fi
    done
    # Without its slurm.conf (never brought up here), a Slurm client retries reading it for 60 s before it fails.
    if [[ -f "$CONF" ]] && scontrol ping >/dev/null 2>&1; then
        sinfo -o "%P %a %D %T %G"
    fi
    echo "SLURM_CONF=$CONF"
}

case "${1:-}" in
    up)
        if [[ "${2:-}" == --nodes ]]; then up "${3:-x}"; elif [[ -z "${2:-}" ]]; then up ""; else
            die "usage: $0 up [--nodes N]"; fi ;;
    down) down ;;
    status) status ;;
    fail-node) fail_node "${2:-}" ;;
    *) echo "usage: $0 up [--nodes N]|down|status|fail-node NODE" >&2; exit 2 ;;
esac
