#!/usr/bin/env bash
# Owned by deploy/local/chromium.sh: Debian's Chromium for the dashboard's browser tests.
# Installs the packages chromium and chromium-driver with apt-get when /usr/bin/chromium is
# missing (idempotent: already installed = success), then checks that it starts headless.
# Playwright drives this binary (executable_path=/usr/bin/chromium); it never downloads a
# browser of its own.
#
#   deploy/local/chromium.sh [up|status]
#
# Environment:
#   SAFEDELIVR_CHROMIUM   the binary to use (default /usr/bin/chromium)
#
# Installing needs root (or passwordless sudo).
set -euo pipefail

COMPONENT=chromium
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CHROMIUM="${SAFEDELIVR_CHROMIUM:-/usr/bin/chromium}"
readonly PACKAGES=(chromium chromium-driver)

usage() {
    sed -n '2,/^set -euo/{/^#/s/^# \{0,1\}//p}' "${BASH_SOURCE[0]}"
    exit 2
}

as_root() {
    if ((EUID == 0)); then
        "$@"
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo -n "$@"
    else
        die "installing ${PACKAGES[*]} needs root; run: sudo apt-get install -y ${PACKAGES[*]}"
    fi
}

install() {
    command -v apt-get >/dev/null || die "apt-get not found; install Chromium yourself and set SAFEDELIVR_CHROMIUM"
    log "installing ${PACKAGES[*]} from Debian's packages"
    take_lock chromium-install 900
    if [[ -x "$CHROMIUM" ]]; then
        return 0 # another process installed it while we waited for the lock
    fi
    local start
    start="$(now)"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null ||
        warn "apt-get update failed; trying the existing package lists"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${PACKAGES[@]}" >"$STATE_DIR/chromium-apt.log" 2>&1 ||
        die "apt-get install failed; see $STATE_DIR/chromium-apt.log"
    log "installed in $(elapsed "$start")s (log: $STATE_DIR/chromium-apt.log)"
}

check() {
    local version
    version="$("$CHROMIUM" --headless --no-sandbox --disable-gpu --version 2>/dev/null)" ||
        die "$CHROMIUM is installed but does not start"
    log "ready: $version ($CHROMIUM)"
}

cmd="${1:-up}"
case "$cmd" in
up)
    mkdir -p "$STATE_DIR"
    [[ -x "$CHROMIUM" ]] || install
    [[ -x "$CHROMIUM" ]] || die "$CHROMIUM is still missing after the install"
    check
    ;;
status)
    if [[ -x "$CHROMIUM" ]]; then
        check
    else
        log "not installed ($CHROMIUM missing)"
        exit 1
    fi
    ;;
*) usage ;;
esac
