#!/usr/bin/env bash
# Owned by deploy/cluster/cluster.sh: a three-node Cassandra and a three-node
# RabbitMQ on this one machine, for `make cluster-test` and for trying what a
# multi-machine deployment does when a node dies.
#
#   deploy/cluster/cluster.sh up|down|status|env
#   deploy/cluster/cluster.sh kill cassandra|rabbitmq N     (kill -9 node N)
#   deploy/cluster/cluster.sh start cassandra|rabbitmq N    (start node N again)
#
# Cassandra: nodes on 127.0.0.1, 127.0.0.2 and 127.0.0.3 (CQL port 9142,
# storage port 7100, JMX 7201-7203), one datacenter (datacenter1), the first
# node the seed; the keyspace is created with replication factor 3 and every
# request runs at LOCAL_QUORUM, so any one node may be down.
# RabbitMQ: nodes safedelivr-5681/5682/5683@<host> (AMQP 5681-5683,
# management 15681-15683) joined into one cluster; every Safedelivr queue is a
# quorum queue, replicated on all three, so any one node may be down.
# Both run beside the single-node services of `make services-up` (other
# ports) and keep their data under $SAFEDELIVR_STATE_DIR/cluster/.
#
# `env` prints the SAFEDELIVR_* settings that point the services at this
# cluster (`set -a; eval "$(deploy/cluster/cluster.sh env)"; set +a`).
#
# Environment:
#   SAFEDELIVR_CLUSTER_CASSANDRA_HEAP   heap of each Cassandra node (default 768M)
#   SAFEDELIVR_STATE_DIR                state dir (default <repo>/.state)
set -euo pipefail

COMPONENT=cluster
CLUSTER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source-path=SCRIPTDIR source=../local/lib.sh
source "$CLUSTER_DIR/../local/lib.sh"

PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"

readonly NODES=(1 2 3)
readonly CQL_PORT=9142
readonly CASSANDRA_STORAGE_PORT=7100
readonly CASSANDRA_JMX_BASE=7200
readonly AMQP_BASE=5680
readonly MANAGEMENT_BASE=15680
readonly CLUSTER_NAME=safedelivr-cluster
readonly DATACENTER=datacenter1
HEAP="${SAFEDELIVR_CLUSTER_CASSANDRA_HEAP:-768M}"
NODE_STATE="$STATE_DIR/cluster"

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 2
}

check_node() {
    [[ "${1:-}" =~ ^[123]$ ]] || die "node must be 1, 2 or 3, got '${1:-}'"
}

cassandra_address() { printf '127.0.0.%s\n' "$1"; }

# cassandra N ACTION: deploy/local/cassandra.sh for node N.
cassandra() {
    local n="$1" action="$2"
    SAFEDELIVR_STATE_DIR="$NODE_STATE/cassandra-$n" \
        SAFEDELIVR_CASSANDRA_LISTEN_ADDRESS="$(cassandra_address "$n")" \
        SAFEDELIVR_CASSANDRA_SEEDS="$(cassandra_address 1):$CASSANDRA_STORAGE_PORT" \
        SAFEDELIVR_CASSANDRA_CLUSTER_NAME="$CLUSTER_NAME" \
        SAFEDELIVR_CASSANDRA_TOKEN_RF=3 \
        SAFEDELIVR_CASSANDRA_PORT="$CQL_PORT" \
        SAFEDELIVR_CASSANDRA_STORAGE_PORT="$CASSANDRA_STORAGE_PORT" \
        SAFEDELIVR_CASSANDRA_JMX_PORT="$((CASSANDRA_JMX_BASE + n))" \
        SAFEDELIVR_CASSANDRA_HEAP="$HEAP" \
        PYTHON="$PYTHON" \
        "$LOCAL_DIR/cassandra.sh" "$action"
}

# rabbitmq N ACTION: deploy/local/rabbitmq.sh for node N.
rabbitmq() {
    local n="$1" action="$2"
    SAFEDELIVR_STATE_DIR="$NODE_STATE/rabbitmq-$n" \
        SAFEDELIVR_RABBITMQ_PORT="$((AMQP_BASE + n))" \
        SAFEDELIVR_RABBITMQ_MANAGEMENT_PORT="$((MANAGEMENT_BASE + n))" \
        PYTHON="$PYTHON" \
        "$LOCAL_DIR/rabbitmq.sh" "$action"
}

rabbit_node() {
    printf 'safedelivr-%s@%s\n' "$((AMQP_BASE + $1))" "$(hostname -s 2>/dev/null || hostname)"
}

# joined N: node N is a running member of node 1's cluster.
joined() {
    timeout 30 rabbitmqctl -n "$(rabbit_node 1)" cluster_status --formatter json 2>/dev/null |
        "$PYTHON" -c 'import json,sys; sys.exit(0 if sys.argv[1] in json.load(sys.stdin)["running_nodes"] else 1)' \
            "$(rabbit_node "$1")"
}

join_rabbitmq() {
    local n="$1" node
    node="$(rabbit_node "$n")"
    if joined "$n"; then
        return 0
    fi
    log "joining RabbitMQ $node to $(rabbit_node 1)"
    timeout 60 rabbitmqctl -n "$node" stop_app >/dev/null
    timeout 60 rabbitmqctl -n "$node" join_cluster "$(rabbit_node 1)" >/dev/null ||
        die "rabbitmqctl join_cluster failed for $node"
    timeout 60 rabbitmqctl -n "$node" start_app >/dev/null
    joined "$n" || die "$node did not join $(rabbit_node 1)"
}

# pid_of KIND N: the process of node N (empty when it is not running).
pid_of() {
    local kind="$1" n="$2" file pid
    case "$kind" in
        cassandra) file="$NODE_STATE/cassandra-$n/cassandra/cassandra.pid" ;;
        rabbitmq) file="$NODE_STATE/rabbitmq-$n/rabbitmq/started-by-deploy-local" ;;
    esac
    [[ -f "$file" ]] || return 0
    pid="$(sed -n 's/^pid=//p' "$file")"
    [[ -n "$pid" ]] || pid="$(tr -dc '0-9' <"$file")"
    if pid_alive "$pid"; then printf '%s\n' "$pid"; fi
}

cmd_up() {
    local t0 n
    t0="$(now)"
    require_python
    mkdir -p "$NODE_STATE"
    # RabbitMQ and Cassandra start side by side. Cassandra nodes one at a time
    # (a new node picks its tokens from the ring it sees); RabbitMQ nodes all at
    # once, because a clustered node waits for the peers it last saw running
    # before it opens its port. Only a first start (when `up` may still have to
    # install rabbitmq-server) starts node 1 alone first.
    (
        if ! command -v rabbitmq-server >/dev/null 2>&1; then
            rabbitmq 1 up || exit 1
        fi
        for n in "${NODES[@]}"; do rabbitmq "$n" up & done
        failed=0
        for pid in $(jobs -p); do wait "$pid" || failed=1; done
        exit "$failed"
    ) &
    for n in "${NODES[@]}"; do
        cassandra "$n" up || die "Cassandra node $n did not start"
    done
    wait_all_background "RabbitMQ"
    for n in 2 3; do join_rabbitmq "$n"; done
    log "cluster up in $(elapsed "$t0")s: Cassandra $(cassandra_address 1)-3:$CQL_PORT, RabbitMQ 127.0.0.1:$((AMQP_BASE + 1))-$((AMQP_BASE + 3))"
}

# wait_all_background WHAT: wait for every background job; die if one failed.
wait_all_background() {
    local pid failed=0
    for pid in $(jobs -p); do
        wait "$pid" || failed=1
    done
    ((failed == 0)) || die "a $1 node did not start (see above)"
}

cmd_down() {
    local n
    for n in "${NODES[@]}"; do cassandra "$n" down & done
    for n in "${NODES[@]}"; do rabbitmq "$n" down & done
    wait_all_background "node"
}

cmd_status() {
    local n rc=0
    require_python
    for n in "${NODES[@]}"; do
        cassandra "$n" status || rc=1
    done
    for n in "${NODES[@]}"; do
        rabbitmq "$n" status || rc=1
        if ((n > 1)) && ! joined "$n"; then
            warn "RabbitMQ $(rabbit_node "$n") is not a running member of the cluster"
            rc=1
        fi
    done
    return "$rc"
}

cmd_env() {
    local n urls=()
    for n in "${NODES[@]}"; do urls+=("amqp://guest:guest@127.0.0.1:$((AMQP_BASE + n))/"); done
    printf '%s\n' \
        "SAFEDELIVR_CASSANDRA_HOSTS=$(cassandra_address 1),$(cassandra_address 2),$(cassandra_address 3)" \
        "SAFEDELIVR_CASSANDRA_PORT=$CQL_PORT" \
        "SAFEDELIVR_CASSANDRA_LOCAL_DC=$DATACENTER" \
        "SAFEDELIVR_CASSANDRA_REPLICATION=\"{'class': 'NetworkTopologyStrategy', '$DATACENTER': 3}\"" \
        "SAFEDELIVR_AMQP_URL=$(
            IFS=,
            printf '%s' "${urls[*]}"
        )"
}

cmd_kill() {
    local kind="$1" n="$2" pid
    check_node "$n"
    pid="$(pid_of "$kind" "$n")"
    [[ -n "$pid" ]] || die "$kind node $n is not running"
    log "kill -9 $kind node $n (pid $pid)"
    # Each node was started with setsid, so its pid leads a process group; for
    # RabbitMQ that holds the start script and its Erlang VM.
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 30 || die "$kind node $n (pid $pid) survived kill -9"
}

cmd_start() {
    local kind="$1" n="$2"
    check_node "$n"
    case "$kind" in
        cassandra) cassandra "$n" up ;;
        rabbitmq) rabbitmq "$n" up ;;
    esac
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) cmd_env ;;
    kill | start)
        [[ "${2:-}" == cassandra || "${2:-}" == rabbitmq ]] || usage
        "cmd_$1" "$2" "${3:-}"
        ;;
    *) usage ;;
esac
