#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for tests and local use.
#
#   deploy/slurm/local-cluster.sh up       install (as root) if missing, configure, start, wait for idle
#   deploy/slurm/local-cluster.sh status   what runs, and the node's state
#   deploy/slurm/local-cluster.sh down     stop exactly the daemons `up` started (pid files)
#
# Everything lives under $TP_SLURM_DIR (default /tmp/tp-slurm): etc/ (slurm.conf, gres.conf),
# state/, run/ (pid files), log/, gpus/ (plain files standing in for GPUs). Clients find the
# config through SLURM_CONF=$TP_SLURM_DIR/etc/slurm.conf; when /etc/slurm/slurm.conf is free,
# `up` also links it there so plain `sbatch` works.
set -euo pipefail

DIR="${TP_SLURM_DIR:-/tmp/tp-slurm}"
GPUS="${TP_SLURM_GPUS:-4}"
SPOT_GRACE_SECONDS="${TP_SLURM_SPOT_GRACE:-10}"
WAIT_SECONDS="${TP_SLURM_WAIT_SECONDS:-60}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
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
        -e "s|@SPOT_GRACE_SECONDS@|$SPOT_GRACE_SECONDS|g" "$TEMPLATE" >"$CONF.tmp"
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

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n1; }

node_idle() { [[ "$(node_state)" == idle ]]; }

# A running cluster may be busy with jobs: allocated or mixed is as good as idle there.
node_usable() { [[ "$(node_state)" =~ ^(idle|mixed|allocated|completing)$ ]]; }

up() {
    mkdir -p "$DIR/log"
    install_packages
    if alive "$DIR/run/slurmctld.pid" && alive "$DIR/run/slurmd.pid" && scontrol ping >/dev/null 2>&1 \
        && node_usable; then
        log "already up (state in $DIR)"
        echo "SLURM_CONF=$CONF"
        return
    fi
    write_config
    start_munge
    alive "$DIR/run/slurmctld.pid" || slurmctld -f "$CONF"
    wait_for "slurmctld up" scontrol ping || die "slurmctld did not answer; see $DIR/log/slurmctld.log"
    alive "$DIR/run/slurmd.pid" || slurmd -f "$CONF"
    if ! wait_for "node $HOST idle" node_idle; then
        # A node left down/drained by an earlier run comes back with an explicit resume.
        scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
        wait_for "node $HOST idle" node_idle \
            || die "node $HOST is '$(node_state)', not idle after ${WAIT_SECONDS}s; see $DIR/log/slurmd.log"
    fi
    echo "SLURM_CONF=$CONF"
}

down() {
    # Jobs first: their steps would otherwise outlive slurmd as orphans.
    if alive "$DIR/run/slurmctld.pid"; then
        scancel --full --quiet --user=root >/dev/null 2>&1 || true
    fi
    stop_pidfile slurmd "$DIR/run/slurmd.pid"
    stop_pidfile slurmctld "$DIR/run/slurmctld.pid"
    stop_pidfile munged "$DIR/run/munged.pid.ours"
    if [[ "$(readlink /etc/slurm/slurm.conf 2>/dev/null)" == "$CONF" ]]; then rm -f /etc/slurm/slurm.conf; fi
}

status() {
    local name
    for name in munged.pid.ours slurmctld.pid slurmd.pid; do
        if alive "$DIR/run/$name"; then echo "${name%%.*}: running (pid $(cat "$DIR/run/$name"))"
        else echo "${name%%.*}: not running (ours)"; fi
    done
    if scontrol ping >/dev/null 2>&1; then
        sinfo -o "%P %a %D %T %G"
    fi
    echo "SLURM_CONF=$CONF"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
