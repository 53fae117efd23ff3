#!/usr/bin/env bash
# Owned by deploy/local/cassandra.sh: the local single-node Apache Cassandra
# 5.0 for Safedelivr development and tests, run straight from Maven Central
# jars (no tarball, no package): fetches cassandra-all and its runtime
# dependencies once into a cache, renders the node's config into the state
# dir, starts CassandraDaemon in the background, stops only the process it
# started, and probes it with a real CQL query.
#
#   deploy/local/cassandra.sh up|down|status
#
# Environment:
#   SAFEDELIVR_CASSANDRA_VERSION        cassandra-all version (default 5.0.6)
#   SAFEDELIVR_CASSANDRA_LISTEN_ADDRESS node address for CQL and gossip (default 127.0.0.1)
#   SAFEDELIVR_CASSANDRA_SEEDS          seed list "ip:port,..." (default: this node alone)
#   SAFEDELIVR_CASSANDRA_CLUSTER_NAME   cluster name (default safedelivr-local)
#   SAFEDELIVR_CASSANDRA_TOKEN_RF       replication factor token allocation optimises for (default 1)
#   SAFEDELIVR_CASSANDRA_PORT           CQL native port (default 9042)
#   SAFEDELIVR_CASSANDRA_STORAGE_PORT   inter-node port (default 7000)
#   SAFEDELIVR_CASSANDRA_JMX_PORT       local-only JMX port (default 7199)
#   SAFEDELIVR_CASSANDRA_HEAP           -Xms/-Xmx (default 1G)
#   SAFEDELIVR_CASSANDRA_START_TIMEOUT  seconds to wait for CQL (default 240)
#   SAFEDELIVR_CASSANDRA_JVM_OPTS       extra JVM flags, whitespace-separated
#   SAFEDELIVR_CASSANDRA_PAXOS_STATE_PURGING  gc_grace, or repaired when paxos repairs run regularly (default gc_grace)
#   SAFEDELIVR_CASSANDRA_UNSAFE_SYSTEM  1: schema changes skip the system tables' flush, for a throwaway node (default 0)
#   SAFEDELIVR_CACHE_DIR                jar cache (default ~/.cache/safedelivr)
#   SAFEDELIVR_STATE_DIR                state dir (default <repo>/.state)
#   JAVA_HOME                           Java 17 to use (default: java on PATH)
#   PYTHON                              interpreter with cassandra-driver (default <repo>/.venv/bin/python)
#
# Layout: jars in $SAFEDELIVR_CACHE_DIR/cassandra-<version>/lib; config, data,
# commit log, caches, hints and logs under $SAFEDELIVR_STATE_DIR/cassandra/.
# Maven is only needed the first time (while the jar cache is empty).
set -euo pipefail

COMPONENT=cassandra
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly MAIN_CLASS=org.apache.cassandra.service.CassandraDaemon
readonly DEPENDENCY_PLUGIN=org.apache.maven.plugins:maven-dependency-plugin:3.6.1
readonly STOP_TIMEOUT=60
VERSION="${SAFEDELIVR_CASSANDRA_VERSION:-5.0.6}"
HOST="${SAFEDELIVR_CASSANDRA_LISTEN_ADDRESS:-127.0.0.1}"
CLUSTER_NAME="${SAFEDELIVR_CASSANDRA_CLUSTER_NAME:-safedelivr-local}"
TOKEN_RF="${SAFEDELIVR_CASSANDRA_TOKEN_RF:-1}"
NATIVE_PORT="${SAFEDELIVR_CASSANDRA_PORT:-9042}"
STORAGE_PORT="${SAFEDELIVR_CASSANDRA_STORAGE_PORT:-7000}"
JMX_PORT="${SAFEDELIVR_CASSANDRA_JMX_PORT:-7199}"
HEAP="${SAFEDELIVR_CASSANDRA_HEAP:-1G}"
START_TIMEOUT="${SAFEDELIVR_CASSANDRA_START_TIMEOUT:-240}"
PAXOS_STATE_PURGING="${SAFEDELIVR_CASSANDRA_PAXOS_STATE_PURGING:-gc_grace}"
SEEDS="${SAFEDELIVR_CASSANDRA_SEEDS:-$HOST:$STORAGE_PORT}"
CACHE_DIR="${SAFEDELIVR_CACHE_DIR:-${HOME:?HOME is not set; set SAFEDELIVR_CACHE_DIR}/.cache/safedelivr}"

TEMPLATE_DIR="$LOCAL_DIR/cassandra"
DIST_DIR="$CACHE_DIR/cassandra-$VERSION"
LIB_DIR="$DIST_DIR/lib"
COMPLETE_MARKER="$DIST_DIR/.complete"
CASS_DIR="$STATE_DIR/cassandra"
CONF_DIR="$CASS_DIR/conf"
LOG_DIR="$CASS_DIR/logs"
PID_FILE="$CASS_DIR/cassandra.pid"
# Written once this node has run with paxos_variant v2 (see paxos_purging).
PAXOS_MARKER="$CASS_DIR/paxos-v2"
INSTANCE_FILE="$CASS_DIR/instance.env"
STDOUT_LOG="$LOG_DIR/stdout.log"
JAVA=""
PAXOS_PURGING=""

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 2
}

validate_settings() {
    require_uint SAFEDELIVR_CASSANDRA_PORT "$NATIVE_PORT"
    require_uint SAFEDELIVR_CASSANDRA_STORAGE_PORT "$STORAGE_PORT"
    require_uint SAFEDELIVR_CASSANDRA_JMX_PORT "$JMX_PORT"
    require_uint SAFEDELIVR_CASSANDRA_START_TIMEOUT "$START_TIMEOUT"
    require_uint SAFEDELIVR_CASSANDRA_TOKEN_RF "$TOKEN_RF"
    [[ "$HOST" =~ ^127\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "SAFEDELIVR_CASSANDRA_LISTEN_ADDRESS must be a loopback IPv4 address (127.x.y.z), got '$HOST'"
    [[ "$SEEDS" =~ ^[0-9.:,]+$ ]] || die "SAFEDELIVR_CASSANDRA_SEEDS must look like 127.0.0.1:7000,127.0.0.2:7000, got '$SEEDS'"
    [[ "$CLUSTER_NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || die "SAFEDELIVR_CASSANDRA_CLUSTER_NAME may hold only letters, digits and _.-, got '$CLUSTER_NAME'"
    [[ "$HEAP" =~ ^[0-9]+[kKmMgG]$ ]] || die "SAFEDELIVR_CASSANDRA_HEAP must look like 512M or 1G, got '$HEAP'"
    [[ "$VERSION" =~ ^[0-9A-Za-z.+-]+$ ]] || die "SAFEDELIVR_CASSANDRA_VERSION looks wrong: '$VERSION'"
    [[ "$PAXOS_STATE_PURGING" == gc_grace || "$PAXOS_STATE_PURGING" == repaired ]] || die "SAFEDELIVR_CASSANDRA_PAXOS_STATE_PURGING must be gc_grace or repaired, got '$PAXOS_STATE_PURGING'"
}

# paxos_purging: the paxos_state_purging this start renders. A node whose data
# was written with paxos_variant v1 (data but no $PAXOS_MARKER: started before
# v2 was configured here) first starts with v2 and legacy purging, since
# Cassandra allows changing the purging only once the node runs v2; the start
# after that moves to $PAXOS_STATE_PURGING. A new node starts with both.
paxos_purging() {
    if [[ -d "$CASS_DIR/data/system" && ! -f "$PAXOS_MARKER" ]]; then
        printf 'legacy\n'
    else
        printf '%s\n' "$PAXOS_STATE_PURGING"
    fi
}

cql_ok() {
    probe_quiet cql --host "$HOST" --port "$NATIVE_PORT" --timeout "${1:-5}"
}

# The probe's human-readable line ("CQL OK at ...: Cassandra 5.0.6 (...)").
probe_summary() {
    local line
    line="$(grep '^probe: ' <<<"$PROBE_OUTPUT" | tail -n 1)"
    printf '%s\n' "${line:-probe: nothing is listening on $HOST:$NATIVE_PORT}" | sed 's/^probe: //'
}

instance_get() {
    sed -n "s/^$1=//p" "$INSTANCE_FILE" 2>/dev/null | head -n 1
}

# our_pid: the recorded pid, if it is still our CassandraDaemon (same config).
our_pid() {
    local pid cmdline
    [[ -f "$PID_FILE" ]] || return 1
    pid="$(tr -dc '0-9' <"$PID_FILE")"
    pid_alive "$pid" || return 1
    cmdline="$(pid_cmdline "$pid")"
    [[ "$cmdline" == *"$MAIN_CLASS"* && "$cmdline" == *"$CONF_DIR/cassandra.yaml"* ]] || return 1
    printf '%s\n' "$pid"
}

find_java() {
    local version major
    if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
        JAVA="$JAVA_HOME/bin/java"
    elif ! JAVA="$(command -v java)"; then
        die "java not found; Cassandra $VERSION needs Java 17 (Debian: apt-get install openjdk-17-jre-headless), or set JAVA_HOME"
    fi
    version="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)"
    [[ -n "$version" ]] || die "could not determine the version of $JAVA"
    if [[ "$version" == 1.* ]]; then major="$(cut -d. -f2 <<<"$version")"; else major="${version%%[.+-]*}"; fi
    [[ "$major" =~ ^[0-9]+$ ]] || die "could not parse Java version '$version' of $JAVA"
    if ((major < 17)); then
        die "$JAVA is Java $version; this setup runs Cassandra on Java 17 (set JAVA_HOME to a Java 17 install)"
    fi
    if ((major > 17)); then
        warn "$JAVA is Java $version; Cassandra 5.0 officially supports Java 11 and 17 only - trying anyway"
    fi
}

# fetch_jars: download cassandra-all + runtime deps once into $LIB_DIR.
fetch_jars() {
    local tmp t0 count size mvn_log
    if [[ -f "$COMPLETE_MARKER" ]]; then
        log "using cached Cassandra $VERSION jars: $LIB_DIR"
        return 0
    fi
    command -v mvn >/dev/null || die "Maven (mvn) is needed once to download Cassandra $VERSION into $DIST_DIR (Debian: apt-get install maven)"
    mkdir -p "$DIST_DIR"
    # Several checkouts may share the cache: one download at a time.
    exec 8>"$CACHE_DIR/cassandra-$VERSION.lock"
    flock -w 1800 8 || die "timed out waiting for $CACHE_DIR/cassandra-$VERSION.lock"
    if [[ -f "$COMPLETE_MARKER" ]]; then
        exec 8>&-
        log "using cached Cassandra $VERSION jars: $LIB_DIR"
        return 0
    fi
    tmp="$DIST_DIR/lib.partial"
    rm -rf "$tmp"
    t0="$(now)"
    log "downloading cassandra-all $VERSION and its runtime dependencies from Maven Central into $LIB_DIR (once)"
    mvn_log="$DIST_DIR/maven.log"
    if ! mvn -B -q -f "$TEMPLATE_DIR/pom.xml" "$DEPENDENCY_PLUGIN:copy-dependencies" \
        -DincludeScope=runtime -DoutputDirectory="$tmp" -Dcassandra.version="$VERSION" \
        >"$mvn_log" 2>&1 </dev/null 8>&- 9>&-; then
        rm -rf "$tmp"
        tail -n 40 "$mvn_log" >&2
        die "Maven could not fetch org.apache.cassandra:cassandra-all:$VERSION (full output: $mvn_log)"
    fi
    [[ -f "$tmp/cassandra-all-$VERSION.jar" ]] || die "Maven finished but $tmp/cassandra-all-$VERSION.jar is missing"
    rm -rf "$LIB_DIR"
    mv "$tmp" "$LIB_DIR"
    count="$(find "$LIB_DIR" -name '*.jar' | wc -l)"
    size="$(du -sh "$LIB_DIR" | cut -f1)"
    printf 'version=%s\njars=%s\nfetched_at=%s\n' "$VERSION" "$count" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$COMPLETE_MARKER"
    exec 8>&-
    log "fetched $count jars ($size) in $(elapsed "$t0")s"
}

sed_replacement_escape() {
    printf '%s' "$1" | sed -e 's/[\\&|]/\\&/g'
}

# write_config: render cassandra.yaml and copy logback.xml into $CONF_DIR.
write_config() {
    local dir out
    mkdir -p "$CONF_DIR" "$CONF_DIR/triggers" "$LOG_DIR"
    for dir in data commitlog saved_caches hints cdc_raw; do
        mkdir -p "$CASS_DIR/$dir"
    done
    out="$CONF_DIR/cassandra.yaml"
    # Paths are single-quoted in the template: double any single quote.
    sed -e "s|\${CASSANDRA_DIR}|$(sed_replacement_escape "${CASS_DIR//\'/\'\'}")|g" \
        -e "s|\${LISTEN_ADDRESS}|$HOST|g" \
        -e "s|\${SEEDS}|$SEEDS|g" \
        -e "s|\${CLUSTER_NAME}|$CLUSTER_NAME|g" \
        -e "s|\${TOKEN_RF}|$TOKEN_RF|g" \
        -e "s|\${STORAGE_PORT}|$STORAGE_PORT|g" \
        -e "s|\${NATIVE_PORT}|$NATIVE_PORT|g" \
        -e "s|\${PAXOS_STATE_PURGING}|$PAXOS_PURGING|g" \
        "$TEMPLATE_DIR/cassandra.yaml.template" >"$out.tmp"
    # shellcheck disable=SC2016 # a literal ${NAME} is what we look for
    if grep -nE '^[^#]*[$][{][A-Za-z_]+[}]' "$out.tmp" >&2; then
        die "unsubstituted placeholders left in $out.tmp (see above)"
    fi
    mv "$out.tmp" "$out"
    cp "$TEMPLATE_DIR/logback.xml" "$CONF_DIR/logback.xml"
}

# read_options FILE: print the flags of a jvm*.options file, one line each
# (lines starting with '-'; a line may hold a flag and its argument).
read_options() {
    local line
    while IFS= read -r line || [[ -n "$line" ]]; do
        line="${line#"${line%%[![:space:]]*}"}"
        line="${line%"${line##*[![:space:]]}"}"
        [[ "$line" == -* ]] && printf '%s\n' "$line"
    done <"$1"
}

# build_jvm_args: fill JVM_ARGS with Cassandra's static flags (checked against
# this JVM; rejected ones are dropped with a warning) plus the dynamic ones
# that cassandra-env.sh / cassandra.in.sh would add.
JVM_ARGS=()
build_jvm_args() {
    local -a lines=() static=() words=()
    local line jamm
    mapfile -t lines < <(read_options "$TEMPLATE_DIR/jvm-server.options"; read_options "$TEMPLATE_DIR/jvm17-server.options")
    for line in "${lines[@]}"; do
        read -ra words <<<"$line"
        static+=("${words[@]}")
    done
    # One quick JVM launch validates them all; only on failure test line by line.
    if ! "$JAVA" -Xms16m -Xmx64m "${static[@]}" -version >/dev/null 2>&1; then
        static=()
        for line in "${lines[@]}"; do
            read -ra words <<<"$line"
            if "$JAVA" -Xms16m -Xmx64m "${words[@]}" -version >/dev/null 2>&1; then
                static+=("${words[@]}")
            else
                warn "this JVM rejects '$line'; leaving it out"
            fi
        done
    fi
    JVM_ARGS=("${static[@]}")

    # Heap: fixed size, as cassandra-env.sh does (-Xms = -Xmx).
    JVM_ARGS+=("-Xms$HEAP" "-Xmx$HEAP")
    # Fail fast (and leave a crash report) on OOM instead of limping on.
    JVM_ARGS+=(-XX:+CrashOnOutOfMemoryError "-XX:HeapDumpPath=$LOG_DIR" "-XX:ErrorFile=$LOG_DIR/hs_err_pid%p.log")
    # GC log, rotated and small.
    JVM_ARGS+=("-Xlog:gc=info:file=$LOG_DIR/gc.log:time,uptime,pid,tid,level:filecount=3,filesize=5M")
    # jamm measures object sizes (memtables, caches); upstream loads it as an agent.
    jamm="$(find "$LIB_DIR" -maxdepth 1 -name 'jamm-*.jar' | sort | tail -n 1)"
    if [[ -n "$jamm" ]]; then
        JVM_ARGS+=("-javaagent:$jamm")
    fi
    JVM_ARGS+=(
        "-Dcassandra.config=file://$CONF_DIR/cassandra.yaml"
        "-Dlogback.configurationFile=$CONF_DIR/logback.xml"
        "-Dcassandra.logdir=$LOG_DIR"
        "-Dcassandra.storagedir=$CASS_DIR"
        # Where CREATE TRIGGER looks for jars (empty; avoids a startup warning).
        "-Dcassandra.triggers_dir=$CONF_DIR/triggers"
        # Keep logging to stdout (captured in stdout.log) instead of closing it.
        "-Dcassandra-foreground=yes"
        # JMX for nodetool & co., bound to loopback without auth (what
        # cassandra-env.sh does with LOCAL_JMX=yes); needs no extra setup.
        "-Dcassandra.jmx.local.port=$JMX_PORT"
    )
    if [[ "$SEEDS" == "$HOST:$STORAGE_PORT" ]]; then
        # Single-node start-up shortcuts (all Cassandra 5.0 system properties):
        # don't wait for gossip to settle (there are no peers), and cut the
        # 30 s ring/schema delays that a brand-new node otherwise sleeps
        # through before picking its tokens.
        JVM_ARGS+=(
            "-Dcassandra.skip_wait_for_gossip_to_settle=0"
            "-Dcassandra.ring_delay_ms=1000"
            "-Dcassandra.schema_delay_ms=1000"
        )
        # Asked for (the CI's throwaway machine does): schema changes skip
        # the flush of the system tables each one otherwise waits for, as
        # Cassandra's own test runs do; a CREATE TABLE takes ~33 ms instead
        # of ~100 ms, and the suite migrates a keyspace per worker and per
        # module that needs one. Not by default: a crash before the next
        # flush loses the schema changes made since (the node starts
        # without those tables, and drops the commit log's rows for them).
        # deploy/cluster's nodes share node 1's seed address, hence RF 1.
        if [[ "${SAFEDELIVR_CASSANDRA_UNSAFE_SYSTEM:-0}" == 1 && "$TOKEN_RF" == 1 ]]; then
            JVM_ARGS+=("-Dcassandra.unsafesystem=true")
        fi
    else
        # A node among peers on one machine: gossip converges within a few
        # rounds over loopback, so 5 s (not 30) is enough to learn the ring.
        JVM_ARGS+=("-Dcassandra.ring_delay_ms=5000" "-Dcassandra.schema_delay_ms=5000")
    fi
    if [[ -n "${SAFEDELIVR_CASSANDRA_JVM_OPTS:-}" ]]; then
        read -ra words <<<"$SAFEDELIVR_CASSANDRA_JVM_OPTS"
        JVM_ARGS+=("${words[@]}")
    fi
}

show_failure_logs() {
    local f
    for f in "$LOG_DIR/system.log" "$STDOUT_LOG"; do
        if [[ -s "$f" ]]; then
            printf '[%s] ---- last 40 lines of %s ----\n' "$COMPONENT" "$f" >&2
            tail -n 40 "$f" >&2
        fi
    done
}

# stop_pid PID: SIGTERM (Cassandra drains on shutdown), then SIGKILL.
stop_pid() {
    local pid="$1"
    kill -TERM "$pid" 2>/dev/null || true
    if ! wait_gone "$pid" "$STOP_TIMEOUT"; then
        warn "Cassandra (pid $pid) still running ${STOP_TIMEOUT}s after SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        wait_gone "$pid" 10 || die "could not stop pid $pid"
    fi
}

clear_pid_files() {
    rm -f "$PID_FILE" "$INSTANCE_FILE"
}

# wait_ready PID T_JVM: wait until CQL answers while PID is alive.
wait_ready() {
    local pid="$1" t_jvm="$2" deadline=$((SECONDS + START_TIMEOUT)) rc=0 status=""
    # The native port opens only when Cassandra is ready for clients, so a
    # cheap TCP check gates the (real) CQL probe.
    while ! { tcp_open "$HOST" "$NATIVE_PORT" && cql_ok 3; }; do
        if ! pid_alive "$pid"; then
            # Exit status is only known when the JVM is our child (127: it is not).
            wait "$pid" 2>/dev/null || rc=$?
            if ((rc != 127)); then status=" with status $rc"; fi
            show_failure_logs
            clear_pid_files
            die "Cassandra (pid $pid) exited during startup$status; logs: $LOG_DIR/"
        fi
        if ((SECONDS >= deadline)); then
            show_failure_logs
            warn "no CQL answer on $HOST:$NATIVE_PORT after ${START_TIMEOUT}s; stopping the Cassandra we started"
            stop_pid "$pid"
            clear_pid_files
            die "Cassandra did not become ready within ${START_TIMEOUT}s (SAFEDELIVR_CASSANDRA_START_TIMEOUT); last probe: $(probe_summary)"
        fi
        sleep 0.5
    done
    log "$(probe_summary); JVM start to CQL ready: $(elapsed "$t_jvm")s"
}

check_port_free() {
    local port="$1" what="$2" variable="$3"
    if tcp_open "$HOST" "$port"; then
        die "$what port $port on $HOST is already in use (by another Cassandra or some other program); stop it or choose another port with $variable"
    fi
}

cmd_up() {
    local t0 t_jvm pid kind
    t0="$(now)"
    validate_settings
    require_python
    take_lock cassandra "$((START_TIMEOUT + 2 * STOP_TIMEOUT + 1800))"

    # Cassandra opens its native port only once it serves CQL, so an open port
    # either answers CQL (already running) or belongs to something else.
    if tcp_open "$HOST" "$NATIVE_PORT"; then
        if cql_ok; then
            if pid="$(our_pid)"; then
                log "Cassandra already running on $HOST:$NATIVE_PORT (pid $pid, started by this script): $(probe_summary)"
            else
                log "Cassandra already running on $HOST:$NATIVE_PORT (not started by this script; 'down' will leave it alone): $(probe_summary)"
            fi
            log "logs: $LOG_DIR/system.log"
            return 0
        fi
        die "native (CQL) port $NATIVE_PORT on $HOST is already in use by something that does not answer CQL ($(probe_summary)); stop it or choose another port with SAFEDELIVR_CASSANDRA_PORT"
    fi
    if pid="$(our_pid)"; then
        if [[ "$(instance_get native_port)" != "$NATIVE_PORT" ]]; then
            die "the Cassandra this script started (pid $pid, state $CASS_DIR) runs with native port $(instance_get native_port), not $NATIVE_PORT; run '$0 down' first or use another SAFEDELIVR_STATE_DIR"
        fi
        log "Cassandra (pid $pid) started earlier is still starting; waiting up to ${START_TIMEOUT}s"
        wait_ready "$pid" "$t0"
        return 0
    fi
    clear_pid_files

    check_port_free "$STORAGE_PORT" "storage (inter-node)" SAFEDELIVR_CASSANDRA_STORAGE_PORT
    check_port_free "$JMX_PORT" "JMX" SAFEDELIVR_CASSANDRA_JMX_PORT

    find_java
    fetch_jars
    PAXOS_PURGING="$(paxos_purging)"
    if [[ "$PAXOS_PURGING" == legacy ]]; then
        log "this node's data was written with Paxos v1: starting it with paxos_variant v2 and legacy purging once; the next start moves to $PAXOS_STATE_PURGING"
    fi
    write_config
    build_jvm_args

    if [[ -d "$CASS_DIR/data/system" ]]; then kind="warm start: existing data"; else kind="cold start: new data directory"; fi
    if [[ -f "$STDOUT_LOG" ]]; then mv -f "$STDOUT_LOG" "$STDOUT_LOG.1"; fi
    t_jvm="$(now)"
    # setsid: own session, so Ctrl-C in this terminal does not reach Cassandra.
    # 8>&- 9>&-: do not let the JVM inherit our locks.
    (
        cd "$CASS_DIR"
        export MALLOC_ARENA_MAX=4 # as cassandra-env.sh: fewer glibc arenas
        exec setsid "$JAVA" "${JVM_ARGS[@]}" -cp "$CONF_DIR:$LIB_DIR/*" "$MAIN_CLASS"
    ) >"$STDOUT_LOG" 2>&1 </dev/null 8>&- 9>&- &
    pid="$!"
    printf '%s\n' "$pid" >"$PID_FILE"
    printf 'pid=%s\nversion=%s\nnative_port=%s\nstorage_port=%s\njmx_port=%s\nstarted_at=%s\n' \
        "$pid" "$VERSION" "$NATIVE_PORT" "$STORAGE_PORT" "$JMX_PORT" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$INSTANCE_FILE"
    log "started Cassandra $VERSION (pid $pid, $kind, heap $HEAP); waiting up to ${START_TIMEOUT}s for CQL on $HOST:$NATIVE_PORT"
    log "logs: $LOG_DIR/system.log, $STDOUT_LOG, $LOG_DIR/gc.log"
    wait_ready "$pid" "$t_jvm"
    printf 'paxos_variant=v2\npaxos_state_purging=%s\nat=%s\n' "$PAXOS_PURGING" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$PAXOS_MARKER"
    log "Cassandra up in $(elapsed "$t0")s in total ($kind); JMX on $HOST:$JMX_PORT"
}

cmd_down() {
    local pid raw
    take_lock cassandra "$((START_TIMEOUT + 2 * STOP_TIMEOUT + 1800))"
    if [[ ! -f "$PID_FILE" ]]; then
        log "Cassandra was not started by us (no $PID_FILE); nothing to stop"
        return 0
    fi
    if ! pid="$(our_pid)"; then
        raw="$(tr -dc '0-9' <"$PID_FILE")"
        if pid_alive "$raw"; then
            warn "pid $raw from $PID_FILE is not our Cassandra (pid reused?); not touching it"
        else
            log "the Cassandra this script started (pid ${raw:-?}) is no longer running"
        fi
        clear_pid_files
        return 0
    fi
    log "stopping Cassandra (pid $pid)"
    stop_pid "$pid"
    clear_pid_files
    log "Cassandra stopped"
}

cmd_status() {
    local pid
    validate_settings
    require_python
    if cql_ok; then
        if pid="$(our_pid)"; then
            log "Cassandra is running on $HOST:$NATIVE_PORT (pid $pid, started by this script): $(probe_summary)"
        else
            log "Cassandra is running on $HOST:$NATIVE_PORT (not started by this script): $(probe_summary)"
        fi
        return 0
    fi
    if pid="$(our_pid)" && [[ "$(instance_get native_port)" == "$NATIVE_PORT" ]]; then
        log "Cassandra (pid $pid, started by this script) is not answering CQL on $HOST:$NATIVE_PORT yet: $(probe_summary)"
    else
        log "Cassandra is not reachable on $HOST:$NATIVE_PORT: $(probe_summary)"
    fi
    return 1
}

case "${1:-}" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) usage ;;
esac
