# shellcheck shell=bash
# Owned by deploy/local/: helpers shared by rabbitmq.sh, cassandra.sh and
# services.sh (sourced, never executed). Defines the repository/state paths,
# logging, the protocol probe wrapper, a raw TCP check and the `up`/`down` lock.
#
# Expects the caller to set COMPONENT (used as the log prefix) before sourcing.

LOCAL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$LOCAL_DIR/../.." && pwd)"
STATE_DIR="${SAFEDELIVR_STATE_DIR:-$ROOT/.state}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PROBE="$LOCAL_DIR/probe.py"
: "${COMPONENT:=local}"

log() {
    printf '[%s] %s\n' "$COMPONENT" "$*"
}

warn() {
    printf '[%s] WARNING: %s\n' "$COMPONENT" "$*" >&2
}

die() {
    printf '[%s] ERROR: %s\n' "$COMPONENT" "$*" >&2
    exit 1
}

# now: wall-clock seconds with microseconds (bash 5 $EPOCHREALTIME).
now() {
    printf '%s\n' "${EPOCHREALTIME/,/.}"
}

# elapsed START: seconds since START (from `now`), one decimal.
elapsed() {
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'
}

require_python() {
    [[ -x "$PYTHON" ]] || die "Python interpreter '$PYTHON' not found; run 'make install' to create .venv, or set PYTHON=/path/to/python (it needs aio-pika and cassandra-driver)."
}

# probe ARGS...: run probe.py; returns 0 (service answered) or 1 (it did not).
# Its messages go to stdout/stderr as usual. Dies when the probe itself cannot
# run (exit 2: usage error or missing client library).
probe() {
    local rc=0
    "$PYTHON" "$PROBE" "$@" || rc=$?
    if ((rc == 2)); then
        die "the probe cannot run with $PYTHON (see the message above)"
    fi
    return "$rc"
}

# probe_quiet ARGS...: like probe, but keeps the output in PROBE_OUTPUT
# (shown only when the probe cannot run).
PROBE_OUTPUT=""
probe_quiet() {
    local rc=0
    PROBE_OUTPUT="$("$PYTHON" "$PROBE" "$@" 2>&1)" || rc=$?
    if ((rc == 2)); then
        printf '%s\n' "$PROBE_OUTPUT" >&2
        die "the probe cannot run with $PYTHON (see the message above)"
    fi
    return "$rc"
}

# tcp_open HOST PORT: true when something accepts TCP connections there.
tcp_open() {
    # shellcheck disable=SC2016 # $1/$2 are expanded by the inner bash
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$1" "$2" 2>/dev/null
}

# take_lock NAME: serialise up/down of one component across processes.
# Uses fd 9; daemons started while holding it must be launched with `9>&-`.
take_lock() {
    local name="$1" wait_s="${2:-600}"
    mkdir -p "$STATE_DIR"
    exec 9>"$STATE_DIR/$name.lock"
    if ! flock -n 9; then
        log "another '$name' operation is in progress; waiting for its lock (up to ${wait_s}s)"
        flock -w "$wait_s" 9 || die "timed out waiting for $STATE_DIR/$name.lock"
    fi
}

# pid_alive PID: the process exists and at least one of its threads is not a
# zombie. (A process whose main thread has exited shows "Z" for its pid while
# its other threads - e.g. a JVM running shutdown hooks - are still working;
# a real zombie waiting to be reaped has only zombie threads.)
pid_alive() {
    local stat
    [[ "$1" =~ ^[0-9]+$ && -d "/proc/$1" ]] || return 1
    for stat in /proc/"$1"/task/*/stat; do
        stat="$(cat "$stat" 2>/dev/null)" || continue
        stat="${stat##*) }"
        if [[ -n "$stat" && "${stat:0:1}" != "Z" ]]; then
            return 0
        fi
    done
    return 1
}

# wait_gone PID SECONDS: wait until PID has exited; false on timeout.
wait_gone() {
    local pid="$1" deadline=$((SECONDS + $2))
    while pid_alive "$pid"; do
        ((SECONDS < deadline)) || return 1
        sleep 0.5
    done
}

# pid_cmdline PID: the process's command line with NULs turned into spaces.
pid_cmdline() {
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null || true
}

# require_uint NAME VALUE: VALUE must be a positive integer.
require_uint() {
    if [[ ! "$2" =~ ^[0-9]+$ ]] || ((10#$2 == 0)); then
        die "$1 must be a positive integer, got '$2'"
    fi
}
