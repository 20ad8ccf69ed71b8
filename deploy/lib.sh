# Helpers shared by the scripts that start local services (deploy/slurm/local-cluster.sh,
# deploy/team/local-stack.sh). Source it after setting LOG_NAME (the prefix of every log line) and
# WAIT_SECONDS (how long wait_for polls); STOP_SECONDS (default 20) bounds a TERM before KILL.

log() { echo "$LOG_NAME: $(date +%T) $*" >&2; }
die() { log "$*"; exit 1; }

alive() {  # alive PIDFILE: the pid file names a running process
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# Poll until "$@" succeeds or WAIT_SECONDS pass; the sleep is the poll interval, not a guess.
wait_for() {
    local what="$1"; shift
    local deadline=$((SECONDS + WAIT_SECONDS))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
    log "$what"
}

# stop_pidfile NAME PIDFILE [--group]: TERM the process (with --group, its whole process group, for
# what was started with setsid), wait for it to exit, KILL it after STOP_SECONDS; the pid file goes.
stop_pidfile() {
    local name="$1" pidfile="$2" group="${3:-}" pid target
    if ! alive "$pidfile"; then rm -f "$pidfile"; return; fi
    pid="$(cat "$pidfile")"
    target="$pid"
    if [[ "$group" == --group ]] && kill -0 -- "-$pid" 2>/dev/null; then target="-$pid"; fi
    kill -TERM -- "$target" 2>/dev/null || true
    if ! WAIT_SECONDS="${STOP_SECONDS:-20}" wait_for "$name stopped" bash -c "! kill -0 $pid"; then
        log "$name ($pid) ignored TERM for ${STOP_SECONDS:-20} s; killing it"  # weed can take longer than that
        kill -KILL -- "$target" 2>/dev/null || true
        WAIT_SECONDS=10 wait_for "$name killed" bash -c "! kill -0 $pid" || true
    fi
    rm -f "$pidfile"
}
