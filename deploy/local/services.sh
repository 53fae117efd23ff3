#!/usr/bin/env bash
# Owned by deploy/local/services.sh: one entry point for all local backing
# services of Safedelivr (RabbitMQ and Cassandra), used by `make services-up`,
# `make services-down` and `make services-status`.
#
#   deploy/local/services.sh up|down|status
#
# up:     starts RabbitMQ and Cassandra concurrently; fails if either fails.
# down:   stops both (each script only stops what it started itself).
# status: probes both; exit 0 only if both answer.
#
# All settings are the environment variables of rabbitmq.sh and cassandra.sh.
set -euo pipefail

COMPONENT=services
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly SERVICES=(rabbitmq cassandra)

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 2
}

# run_all ACTION: run "<service>.sh ACTION" for every service concurrently;
# returns non-zero if any of them failed.
run_all() {
    local action="$1" service failed=() rc
    local -A pids=()
    for service in "${SERVICES[@]}"; do
        "$LOCAL_DIR/$service.sh" "$action" &
        pids[$service]=$!
    done
    for service in "${SERVICES[@]}"; do
        rc=0
        wait "${pids[$service]}" || rc=$?
        if ((rc != 0)); then
            failed+=("$service (exit $rc)")
        fi
    done
    if ((${#failed[@]} > 0)); then
        printf '[%s] %s failed for: %s\n' "$COMPONENT" "$action" "${failed[*]}" >&2
        return 1
    fi
}

case "${1:-}" in
    up)
        t0="$(now)"
        run_all up || die "not all services are up (see the messages above)"
        log "RabbitMQ and Cassandra are up ($(elapsed "$t0")s)"
        ;;
    down)
        run_all down || die "could not stop every service (see the messages above)"
        ;;
    status)
        run_all status || exit 1
        ;;
    *) usage ;;
esac
