#!/usr/bin/env bash
# Owned by deploy/local/rabbitmq.sh: the local RabbitMQ broker for Safedelivr
# development and tests. Installs Debian's rabbitmq-server when missing,
# enables the plugins we use, starts the broker in the background without
# systemd, stops only a broker this script started, and probes it over AMQP.
#
#   deploy/local/rabbitmq.sh up|down|status|heal
#
# heal: RabbitMQ 3.10 (Debian's) can come back from `rabbitmqctl stop_app` /
# `start_app` with the supervisor of quorum queues' dead-lettering stopped
# (rabbit_fifo_dlx_sup: queues recovering before it exists crash it past its
# restart limit); every queue declaration then fails with INTERNAL_ERROR until
# the node restarts. `heal` starts it again in place, checking a few times as
# queues recover; `up` checks it once when the broker is already running.
#
# Environment:
#   SAFEDELIVR_RABBITMQ_PORT             AMQP port (default 5672)
#   SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT  management UI/API port (default 15672)
#   SAFEDELIVR_RABBITMQ_START_TIMEOUT    seconds to wait for AMQP (default 120)
#   SAFEDELIVR_STATE_DIR                 state dir (default <repo>/.state)
#   PYTHON                               interpreter with aio-pika (default <repo>/.venv/bin/python)
#
# The broker listens on 127.0.0.1 only, with the default guest/guest user
# (which RabbitMQ only accepts over loopback). Starting and installing need
# root (the broker itself runs as the "rabbitmq" user). On the default port
# the node is the package's usual rabbit@<host>; on any other port it is
# safedelivr-<port>@<host>, so several brokers can coexist.
set -euo pipefail

COMPONENT=rabbitmq
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Debian puts rabbitmq-server/rabbitmqctl in /usr/sbin.
PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

readonly HOST=127.0.0.1
readonly DEFAULT_PORT=5672
PORT="${SAFEDELIVR_RABBITMQ_PORT:-$DEFAULT_PORT}"
MGMT_PORT="${SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT:-15672}"
START_TIMEOUT="${SAFEDELIVR_RABBITMQ_START_TIMEOUT:-120}"
readonly STOP_TIMEOUT=60
readonly PLUGINS=(rabbitmq_management rabbitmq_consistent_hash_exchange)
readonly RMQ_USER=rabbitmq
readonly RMQ_HOME=/var/lib/rabbitmq
readonly LOG_DIR=/var/log/rabbitmq
RMQ_STATE="$STATE_DIR/rabbitmq"
MARKER="$RMQ_STATE/started-by-deploy-local"
CONSOLE_LOG="$RMQ_STATE/console.log"
AMQP_URL="amqp://guest:guest@$HOST:$PORT/"

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 2
}

node_name() {
    local short
    short="$(hostname -s 2>/dev/null || hostname)"
    if [[ "$PORT" == "$DEFAULT_PORT" ]]; then
        printf 'rabbit@%s\n' "$short"
    else
        printf 'safedelivr-%s@%s\n' "$PORT" "$short"
    fi
}

# marker_get KEY: a value recorded in the "we started it" marker.
marker_get() {
    sed -n "s/^$1=//p" "$MARKER" 2>/dev/null | head -n 1
}

print_logs_hint() {
    local node="${1:-$(node_name)}"
    log "logs: $LOG_DIR/$node.log (broker), $CONSOLE_LOG (console of a broker started here)"
}

amqp_ok() {
    probe_quiet amqp --url "$AMQP_URL" --timeout "${1:-5}"
}

# Our broker process: the marker's pid, if it is still a rabbitmq-server.
our_pid() {
    local pid
    [[ -f "$MARKER" ]] || return 1
    pid="$(marker_get pid)"
    if pid_alive "$pid" && [[ "$(pid_cmdline "$pid")" == *rabbitmq-server* ]]; then
        printf '%s\n' "$pid"
        return 0
    fi
    return 1
}

ensure_installed() {
    if command -v rabbitmq-server >/dev/null && command -v rabbitmqctl >/dev/null; then
        return 0
    fi
    ((EUID == 0)) || die "rabbitmq-server is not installed; installing it needs root (sudo $0 up, or: sudo apt-get install rabbitmq-server)"
    command -v apt-get >/dev/null || die "rabbitmq-server is not installed and there is no apt-get; install RabbitMQ 3.10+ yourself"
    log "rabbitmq-server is not installed; installing Debian's package (apt-get update && apt-get install -y rabbitmq-server)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q || die "apt-get update failed"
    # The package's postinst may try to start the service; on hosts without
    # an init system (policy-rc.d / no systemd) that is refused, which is fine.
    apt-get install -y -q -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        rabbitmq-server || die "apt-get install rabbitmq-server failed"
    if ! command -v rabbitmq-server >/dev/null || ! command -v rabbitmqctl >/dev/null; then
        die "rabbitmq-server was installed but rabbitmq-server/rabbitmqctl are not on PATH"
    fi
    log "installed $(dpkg-query -W -f='rabbitmq-server ${Version}' rabbitmq-server 2>/dev/null || echo rabbitmq-server)"
}

enable_plugins() {
    local out
    # Offline: only rewrites the enabled_plugins file (/etc/rabbitmq/), no node needed.
    if ! out="$(rabbitmq-plugins enable --offline "${PLUGINS[@]}" 2>&1)"; then
        printf '%s\n' "$out" >&2
        die "could not enable plugins ${PLUGINS[*]}"
    fi
    log "plugins enabled: ${PLUGINS[*]}"
}

# Starting/stopping the broker means acting as the rabbitmq user.
require_broker_privileges() {
    if ((EUID != 0)) && [[ "$(id -un)" != "$RMQ_USER" ]]; then
        die "managing the local broker needs root (it runs as the '$RMQ_USER' user); re-run with sudo"
    fi
}

# start_broker NODE: launch rabbitmq-server in the background; sets BROKER_PID.
BROKER_PID=""
start_broker() {
    local node="$1" server bin_dir mgmt_args
    local -a runas=() env_args=()
    # /usr/sbin/rabbitmq-server is Debian's wrapper (it `su`s to rabbitmq and
    # hides the pid); run the real script next to it as the rabbitmq user.
    bin_dir="$(dirname "$(readlink -f "$(command -v rabbitmq-server)")")"
    server="$bin_dir/rabbitmq-server"
    [[ -x "$server" ]] || die "cannot find the rabbitmq-server start script (looked for $server)"
    if ((EUID == 0)); then
        id "$RMQ_USER" >/dev/null 2>&1 || die "user '$RMQ_USER' does not exist (is rabbitmq-server properly installed?)"
        runas=(setpriv "--reuid=$RMQ_USER" "--regid=$RMQ_USER" --init-groups)
    elif [[ "$(id -un)" != "$RMQ_USER" ]]; then
        die "starting the broker needs root (it runs as the '$RMQ_USER' user)"
    fi
    # Management listener on loopback; passed as Erlang app env so no config
    # file has to be written into /etc/rabbitmq.
    mgmt_args="-rabbitmq_management tcp_config [{ip,\"$HOST\"},{port,$MGMT_PORT}]"
    env_args=(
        "HOME=$RMQ_HOME"
        "RABBITMQ_NODENAME=$node"
        "RABBITMQ_NODE_IP_ADDRESS=$HOST"
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=${RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS:+$RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS }$mgmt_args"
    )
    if [[ "$PORT" != "$DEFAULT_PORT" ]]; then
        env_args+=("RABBITMQ_NODE_PORT=$PORT")
    fi
    mkdir -p "$RMQ_STATE"
    # setsid: own session, so Ctrl-C in this terminal does not reach the broker.
    # 9>&-: do not let the broker inherit our lock.
    (
        cd "$RMQ_HOME" 2>/dev/null || cd /
        exec setsid "${runas[@]}" env "${env_args[@]}" "$server"
    ) >"$CONSOLE_LOG" 2>&1 </dev/null 9>&- &
    BROKER_PID="$!"
}

show_failure_logs() {
    local node="$1" f
    for f in "$CONSOLE_LOG" "$LOG_DIR/$node.log"; do
        if [[ -s "$f" ]]; then
            printf '[%s] ---- last 40 lines of %s ----\n' "$COMPONENT" "$f" >&2
            tail -n 40 "$f" >&2
        fi
    done
}

# stop_pid PID NODE: graceful `rabbitmqctl stop`, then signals as fallback.
stop_pid() {
    local pid="$1" node="$2" child
    if ! timeout "$STOP_TIMEOUT" rabbitmqctl -n "$node" stop >/dev/null 2>&1; then
        warn "rabbitmqctl -n $node stop failed; sending SIGTERM to pid $pid"
        kill -TERM "$pid" 2>/dev/null || true
    fi
    if ! wait_gone "$pid" "$STOP_TIMEOUT"; then
        warn "broker (pid $pid) still running after ${STOP_TIMEOUT}s; killing it"
        for child in $(pgrep -P "$pid" 2>/dev/null || true); do
            kill -KILL "$child" 2>/dev/null || true
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || die "could not stop pid $pid"
    fi
}

# wait_ready PID NODE T0 [WHAT]: wait until AMQP answers while PID is alive.
wait_ready() {
    local pid="$1" node="$2" t0="$3" what="${4:-}" deadline=$((SECONDS + START_TIMEOUT))
    # The AMQP listener opens at the end of boot, so a cheap TCP check gates
    # the (real) AMQP probe.
    while ! { tcp_open "$HOST" "$PORT" && amqp_ok 3; }; do
        if ! pid_alive "$pid"; then
            show_failure_logs "$node"
            rm -f "$MARKER"
            die "RabbitMQ (node $node) exited during startup; see the logs above and $LOG_DIR/"
        fi
        if ((SECONDS >= deadline)); then
            show_failure_logs "$node"
            warn "no AMQP handshake on $HOST:$PORT after ${START_TIMEOUT}s; stopping the broker we started"
            stop_pid "$pid" "$node"
            rm -f "$MARKER"
            die "RabbitMQ did not become ready within ${START_TIMEOUT}s (SAFEDELIVR_RABBITMQ_START_TIMEOUT); last probe: ${PROBE_OUTPUT:-nothing is listening on $HOST:$PORT}"
        fi
        sleep 0.5
    done
    log "RabbitMQ ready on $HOST:$PORT (AMQP handshake OK) $(elapsed "$t0")s after 'up' began${what:+ ($what)}"
}

cmd_up() {
    local t0 node pid kind
    t0="$(now)"
    require_uint SAFEDELIVR_RABBITMQ_PORT "$PORT"
    require_uint SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT "$MGMT_PORT"
    require_uint SAFEDELIVR_RABBITMQ_START_TIMEOUT "$START_TIMEOUT"
    require_python
    take_lock rabbitmq "$((START_TIMEOUT + 2 * STOP_TIMEOUT))"
    node="$(node_name)"

    # RabbitMQ opens its AMQP listener only at the end of boot, so an open
    # port either completes an AMQP handshake (already running) or belongs to
    # something else.
    if tcp_open "$HOST" "$PORT"; then
        if amqp_ok; then
            if our_pid >/dev/null; then
                log "RabbitMQ already running on $HOST:$PORT (node $(marker_get node), started by this script, pid $(marker_get pid))"
                cmd_heal 1
            else
                log "RabbitMQ already running on $HOST:$PORT (not started by this script; 'down' will leave it alone)"
            fi
            print_logs_hint "$(marker_get node)"
            return 0
        fi
        die "port $PORT on $HOST is in use by something that does not speak AMQP (${PROBE_OUTPUT#probe: }). Stop it or pick another port with SAFEDELIVR_RABBITMQ_PORT."
    fi

    # A broker we started earlier that is still booting: just wait for it.
    if pid="$(our_pid)"; then
        node="$(marker_get node)"
        log "RabbitMQ (node $node, pid $pid) started earlier is still starting; waiting"
        print_logs_hint "$node"
        wait_ready "$pid" "$node" "$t0"
        return 0
    fi
    rm -f "$MARKER"

    if tcp_open "$HOST" "$MGMT_PORT"; then
        die "management port $MGMT_PORT on $HOST is already in use; free it or set SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT"
    fi

    ensure_installed
    require_broker_privileges
    # The node may already run without us (e.g. the package just started its
    # service on a systemd host, or someone ran rabbitmq-server by hand).
    if timeout 20 rabbitmqctl -n "$node" ping >/dev/null 2>&1; then
        log "RabbitMQ node $node is already running (not started by this script); waiting for AMQP on $HOST:$PORT"
        if probe_quiet amqp --url "$AMQP_URL" --timeout 3 --wait 60; then
            log "RabbitMQ already running on $HOST:$PORT (not started by this script)"
            return 0
        fi
        die "RabbitMQ node $node is running but does not accept AMQP on $HOST:$PORT (${PROBE_OUTPUT#probe: }); stop it (rabbitmqctl -n $node stop) or use another SAFEDELIVR_RABBITMQ_PORT"
    fi
    enable_plugins

    if [[ -d "$RMQ_HOME/mnesia/$node" ]]; then kind="warm start: existing node database"; else kind="cold start: new node database"; fi
    start_broker "$node"
    pid="$BROKER_PID"
    printf 'pid=%s\nnode=%s\nport=%s\nmanagement_port=%s\nstarted_at=%s\n' \
        "$pid" "$node" "$PORT" "$MGMT_PORT" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$MARKER"
    log "started RabbitMQ node $node (pid $pid, $kind); waiting up to ${START_TIMEOUT}s for AMQP on $HOST:$PORT"
    print_logs_hint "$node"
    wait_ready "$pid" "$node" "$t0" "$kind"
    log "management UI: http://$HOST:$MGMT_PORT/ (guest/guest)"
}

cmd_down() {
    local pid node
    take_lock rabbitmq "$((START_TIMEOUT + 2 * STOP_TIMEOUT))"
    if [[ ! -f "$MARKER" ]]; then
        log "RabbitMQ was not started by this script (no $MARKER); leaving any running broker alone"
        return 0
    fi
    node="$(marker_get node)"
    if ! pid="$(our_pid)"; then
        log "RabbitMQ node ${node:-?} that this script started is no longer running; clearing the marker"
        rm -f "$MARKER"
        return 0
    fi
    require_broker_privileges
    log "stopping RabbitMQ node $node (pid $pid)"
    stop_pid "$pid" "$node"
    rm -f "$MARKER"
    log "RabbitMQ stopped"
}

# heal_once NODE: start the dead-letter supervisor again if it is not running;
# prints "ok" (it runs), "healed" (it was started again) or the error.
heal_once() {
    rabbitmqctl -n "$1" eval '
        case whereis(rabbit_fifo_dlx_sup) of
            undefined ->
                case supervisor:restart_child(rabbit_sup, rabbit_fifo_dlx_sup) of
                    {ok, _} -> healed;
                    Other -> Other
                end;
            _ -> ok
        end.' 2>&1 | tail -n 1
}

cmd_heal() {
    local node checks="${1:-6}" i answer
    node="$(marker_get node 2>/dev/null || true)"
    node="${node:-$(node_name)}"
    for ((i = 1; i <= checks; i++)); do
        answer="$(heal_once "$node")"
        case "$answer" in
            ok) ;;
            healed) warn "RabbitMQ's dead-letter supervisor (rabbit_fifo_dlx_sup) had stopped after an app restart; started it again" ;;
            *) warn "could not check RabbitMQ's dead-letter supervisor on $node: $answer" ; return 0 ;;
        esac
        ((i < checks)) && sleep 0.5
    done
    return 0
}

cmd_status() {
    require_python
    if amqp_ok; then
        if our_pid >/dev/null; then
            log "RabbitMQ is running on $HOST:$PORT (node $(marker_get node), pid $(marker_get pid), started by this script)"
        else
            log "RabbitMQ is running on $HOST:$PORT (not started by this script)"
        fi
        return 0
    fi
    log "RabbitMQ is not reachable on $HOST:$PORT (${PROBE_OUTPUT#probe: })"
    return 1
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    heal) cmd_heal ;;
    *) usage ;;
esac
