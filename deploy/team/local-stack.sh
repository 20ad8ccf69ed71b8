#!/usr/bin/env bash
# A team's stack on one machine: PostgreSQL, SeaweedFS S3, an MLflow tracking server, and the platform
# server (Dagster webserver, daemon, code server) on PostgreSQL storage.
#
#   deploy/team/local-stack.sh up       install PostgreSQL (as root) if missing, start everything, print the env
#   deploy/team/local-stack.sh env      print the `export` lines a shell needs to use the stack again
#   deploy/team/local-stack.sh status   what runs, where
#   deploy/team/local-stack.sh down     stop exactly what `up` started (pid files), data kept
#
# Everything lives under $TP_STACK_DIR (default /tmp/tp-stack): pg/ (a PostgreSQL cluster of its own,
# on its own port: the machine's clusters are not touched; its socket in pg-socket/), s3/, home/ (the platform home), run/ (pid
# files), log/, and stack.env (the settings and generated credentials, mode 600). The databases: dagster
# (run, event-log and schedule storage), mlflow (the tracking server's store), optuna (sweeps), platform
# (the platform's shared state: the run registry, the cost ledger, the cost-window queues, locks). Buckets:
# $TP_STACK_BUCKET (checkpoints under checkpoints/, dataset snapshots under snapshots/, MLflow artifacts
# under mlflow/).
set -euo pipefail

DIR="${TP_STACK_DIR:-/tmp/tp-stack}"
PG_PORT="${TP_STACK_PG_PORT:-15432}"
S3_PORT="${TP_STACK_S3_PORT:-18333}"
MLFLOW_PORT="${TP_STACK_MLFLOW_PORT:-15000}"
SERVER_PORT="${TP_STACK_SERVER_PORT:-13000}"
BUCKET="${TP_STACK_BUCKET:-tp-team}"
WAIT_SECONDS="${TP_STACK_WAIT_SECONDS:-120}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CHECKOUT="$(cd "$HERE/../.." && pwd)"
# The platform's own environment when run from a checkout (its tp, mlflow, weed, python).
if [[ -x "$CHECKOUT/.venv/bin/tp" ]]; then PATH="$CHECKOUT/.venv/bin:$PATH"; fi
PYTHON="$(command -v python3)"
if [[ -x "$CHECKOUT/.venv/bin/python" ]]; then PYTHON="$CHECKOUT/.venv/bin/python"; fi

LOG_NAME=local-stack
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

pg_bin() {
    local bin
    for bin in /usr/lib/postgresql/*/bin; do [[ -x "$bin/initdb" ]] && { echo "$bin"; return; }; done
    return 1
}

install_packages() {
    if pg_bin >/dev/null; then return; fi
    [[ $EUID -eq 0 ]] || die "PostgreSQL is not installed; run as root to install it (apt-get install postgresql)"
    log "installing postgresql (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >"$DIR/log/apt.log" 2>&1 || {
        apt-get update -q >>"$DIR/log/apt.log" 2>&1
        apt-get install -y -q postgresql >>"$DIR/log/apt.log" 2>&1
    } || die "apt-get install postgresql failed; see $DIR/log/apt.log"
}

# The postmaster of the stack's own data directory (whatever restarted it since `up`) is the stack's.
pg_running() {
    [[ -s "$DIR/pg/PG_VERSION" ]] && as_pg "$(pg_bin)/pg_ctl" -D "$DIR/pg" status >/dev/null 2>&1
}

# PostgreSQL refuses to run as root: as root, the cluster belongs to the postgres user.
as_pg() {
    if [[ $EUID -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

secret() { "$PYTHON" -c 'import secrets; print(secrets.token_hex(16))'; }

# Settings and credentials, generated once and kept: a second `up` finds the same databases and bucket.
write_settings() {
    [[ -s "$DIR/stack.env" ]] && return
    (
        umask 077
        cat >"$DIR/stack.env" <<EOF
PG_PASSWORD=$(secret)
S3_ACCESS_KEY=tp$(secret | cut -c1-14)
S3_SECRET_KEY=$(secret)
EOF
    )
}

load_settings() {
    # shellcheck disable=SC1091
    source "$DIR/stack.env"
    DB="postgresql+psycopg2://tp:$PG_PASSWORD@127.0.0.1:$PG_PORT"
}

start_postgres() {
    local bin
    bin="$(pg_bin)"
    if [[ $EUID -eq 0 ]] && ! runuser -u postgres -- test -x "$DIR"; then
        die "PostgreSQL runs as the postgres user, who cannot enter $DIR; set TP_STACK_DIR to a directory whose" \
            "parents every user may enter (e.g. under /tmp)"
    fi
    if [[ ! -s "$DIR/pg/PG_VERSION" ]]; then
        mkdir -p "$DIR/pg" "$DIR/pg-socket"
        if [[ $EUID -eq 0 ]]; then chown postgres "$DIR/pg" "$DIR/pg-socket"; fi
        chmod 700 "$DIR/pg"
        as_pg "$bin/initdb" -D "$DIR/pg" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
            >"$DIR/log/initdb.log" 2>&1 || die "initdb failed; see $DIR/log/initdb.log"
    fi
    if ! pg_running; then
        touch "$DIR/log/postgres.log"
        if [[ $EUID -eq 0 ]]; then chown postgres "$DIR/log/postgres.log"; fi
        as_pg "$bin/pg_ctl" -D "$DIR/pg" -l "$DIR/log/postgres.log" -w -t "$WAIT_SECONDS" \
            -o "-p $PG_PORT -k $DIR/pg-socket -c listen_addresses=127.0.0.1" start >/dev/null \
            || die "PostgreSQL did not start on port $PG_PORT (taken? set TP_STACK_PG_PORT); see $DIR/log/postgres.log"
    fi
    local psql=("$bin/psql" -h "$DIR/pg-socket" -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -q)
    if [[ -z "$(as_pg "${psql[@]}" -tAc "select 1 from pg_roles where rolname = 'tp'")" ]]; then
        as_pg "${psql[@]}" -c "create user tp password '$PG_PASSWORD'"
    fi
    local db
    for db in dagster mlflow optuna platform; do
        if [[ -z "$(as_pg "${psql[@]}" -tAc "select 1 from pg_database where datname = '$db'")" ]]; then
            as_pg "${psql[@]}" -c "create database $db owner tp"
        fi
    done
    log "PostgreSQL on 127.0.0.1:$PG_PORT (databases dagster, mlflow, optuna, platform)"
}

start_s3() {
    mkdir -p "$DIR/s3"
    # Only the stack's own key may use the S3 API.
    cat >"$DIR/s3.json" <<EOF
{"identities": [{"name": "tp", "credentials": [{"accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
    chmod 600 "$DIR/s3.json"
    if ! alive "$DIR/run/weed.pid"; then
        # Ports: S3, then master/volume/filer beside it (each also serves gRPC on its port + 10000).
        # No pre-stop wait: it lets a load balancer drain a volume server, and one machine has none; the
        # filer's own 15 s then is all a TERM waits for (`down` kills weed after 20 s).
        setsid weed server -dir="$DIR/s3" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3 -s3.port="$S3_PORT" \
            -s3.config="$DIR/s3.json" -master.port=$((S3_PORT + 1)) -volume.port=$((S3_PORT + 2)) \
            -filer.port=$((S3_PORT + 3)) -master.volumeSizeLimitMB=1024 -volume.max=1000 \
            -master.electionTimeout=1s -s3.port.iceberg=0 -s3.port.lance=0 -volume.preStopSeconds=0 \
            >>"$DIR/log/weed.log" 2>&1 &
        echo $! >"$DIR/run/weed.pid"
    fi
    wait_for "S3 on 127.0.0.1:$S3_PORT (bucket $BUCKET)" s3_bucket_ready \
        || die "SeaweedFS S3 did not take a write on port $S3_PORT$(weed_exit_reason); see $DIR/log/weed.log"
}

weed_exit_reason() {  # weed logs why it gave up on a line of its own ("F1126 ... bind: address already in use")
    alive "$DIR/run/weed.pid" && return
    local fatal
    fatal="$(grep -E '^F[0-9]{4} ' "$DIR/log/weed.log" | tail -n1 | cut -d' ' -f4-)"
    echo " (weed exited${fatal:+: $fatal})"
}

s3_bucket_ready() {  # the bucket exists and takes a write (listing answers before the volume server is up)
    S3_ENDPOINT="http://127.0.0.1:$S3_PORT" BUCKET="$BUCKET" AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" \
        AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" "$PYTHON" - <<'EOF'
import os
import boto3
s3 = boto3.client("s3", endpoint_url=os.environ["S3_ENDPOINT"], region_name="us-east-1")
bucket = os.environ["BUCKET"]
try:
    s3.head_bucket(Bucket=bucket)
except s3.exceptions.ClientError:
    s3.create_bucket(Bucket=bucket)
s3.put_object(Bucket=bucket, Key=".stack-ready", Body=b"ok")
EOF
}

start_mlflow() {
    if ! alive "$DIR/run/mlflow.pid"; then
        # The store's URL (with its password) through the environment: a command line is visible to every user.
        # No job runner: it and its seven workers (about 200 MB each) serve MLflow's GenAI jobs, not training.
        MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
            MLFLOW_BACKEND_STORE_URI="$DB/mlflow" MLFLOW_ARTIFACTS_DESTINATION="s3://$BUCKET/mlflow" \
            MLFLOW_S3_ENDPOINT_URL="http://127.0.0.1:$S3_PORT" AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" \
            AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" setsid mlflow server --host 127.0.0.1 --port "$MLFLOW_PORT" \
            --workers 1 >>"$DIR/log/mlflow.log" 2>&1 &
        echo $! >"$DIR/run/mlflow.pid"
    fi
    wait_for "MLflow tracking server on http://127.0.0.1:$MLFLOW_PORT" \
        curl -fsS "http://127.0.0.1:$MLFLOW_PORT/health" \
        || die "the MLflow server did not answer on port $MLFLOW_PORT; see $DIR/log/mlflow.log"
}

# What a shell (and the platform server it starts) needs: one place, printed by `up` and `env`.
print_env() {
    cat <<EOF
export TP_HOME=$DIR/home
export TP_SERVER_PORT=$SERVER_PORT
export TP_DAGSTER_DATABASE_URL=$DB/dagster
export TP_SWEEP_STORAGE=$DB/optuna
export TP_DATABASE_URL=$DB/platform
export MLFLOW_TRACKING_URI=http://127.0.0.1:$MLFLOW_PORT
export TP_CHECKPOINT_STORE_URI=s3://$BUCKET/checkpoints
export TP_SNAPSHOT_STORE_URI=s3://$BUCKET/snapshots
export TP_S3_ENDPOINT_URL=http://127.0.0.1:$S3_PORT
export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY
export AWS_DEFAULT_REGION=us-east-1
EOF
}

start_platform() {
    mkdir -p "$DIR/home"
    (eval "$(print_env)" && tp server start >&2) || die "the platform server did not start; see $DIR/home/server/"
}

# A port in the kernel's range for outgoing connections may be taken by a client while its server is down,
# and the server's restart then fails ("address already in use"): the tests saw it with weed.
warn_ephemeral_ports() {
    local low high port
    read -r low high 2>/dev/null </proc/sys/net/ipv4/ip_local_port_range || return 0
    for port in "$PG_PORT" "$S3_PORT" $((S3_PORT + 1)) $((S3_PORT + 2)) $((S3_PORT + 3)) $((S3_PORT + 10001)) \
        $((S3_PORT + 10002)) $((S3_PORT + 10003)) "$MLFLOW_PORT" "$SERVER_PORT"; do
        if ((port >= low && port <= high)); then
            log "warning: port $port is in the ephemeral range ($low-$high); a restart may find it taken: use ports below $low"
        fi
    done
}

up() {
    mkdir -p "$DIR/log" "$DIR/run"
    install_packages
    write_settings
    load_settings
    warn_ephemeral_ports
    start_postgres
    start_s3
    start_mlflow
    start_platform
    log "up; use it from a shell with: eval \"\$($0 env)\""
    print_env
}

down() {
    [[ -s "$DIR/stack.env" ]] || { log "nothing to stop in $DIR"; return; }
    load_settings
    if [[ -s "$DIR/home/server/server.json" ]]; then
        (eval "$(print_env)" && tp server stop --force >&2) || log "tp server stop failed; see $DIR/home/server/"
    fi
    stop_pidfile mlflow "$DIR/run/mlflow.pid" --group
    stop_pidfile weed "$DIR/run/weed.pid" --group
    if pg_running; then
        local pid
        pid="$(head -n1 "$DIR/pg/postmaster.pid")"
        as_pg "$(pg_bin)/pg_ctl" -D "$DIR/pg" -m fast -w stop >/dev/null
        # pg_ctl returns once the pid file is gone, a moment before the postmaster itself.
        WAIT_SECONDS=20 wait_for "PostgreSQL stopped" bash -c "! kill -0 $pid" || log "PostgreSQL ($pid) still exits"
    fi
}

status() {
    [[ -s "$DIR/stack.env" ]] || { echo "no stack in $DIR (start it: $0 up)"; return 1; }
    load_settings
    local rc=0
    if pg_running; then echo "postgres: running (port $PG_PORT)"
    else echo "postgres: not running"; rc=1; fi
    if alive "$DIR/run/weed.pid"; then echo "s3: running (http://127.0.0.1:$S3_PORT, bucket $BUCKET)"
    else echo "s3: not running"; rc=1; fi
    if alive "$DIR/run/mlflow.pid"; then echo "mlflow: running (http://127.0.0.1:$MLFLOW_PORT)"
    else echo "mlflow: not running"; rc=1; fi
    (eval "$(print_env)" && tp server status) || rc=1
    return $rc
}

env_cmd() {
    [[ -s "$DIR/stack.env" ]] || die "no stack in $DIR; start it with: $0 up"
    load_settings
    print_env
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    status) status ;;
    env) env_cmd ;;
    *) echo "usage: $0 up|env|status|down" >&2; exit 2 ;;
esac
