#!/usr/bin/env bash
# Install Debian's Chromium and its WebDriver for the dashboard's browser tests.
#
#   scripts/chromium.sh install   apt-get install chromium and chromium-driver if missing
#   scripts/chromium.sh check     exit 0 when both are installed, print their versions
#
# The tests drive /usr/bin/chromium through /usr/bin/chromedriver (selenium with an explicit
# Service, SE_OFFLINE=true): Selenium Manager never downloads a browser or a driver.
set -euo pipefail

PACKAGES=(chromium chromium-driver)
BINARIES=(/usr/bin/chromium /usr/bin/chromedriver)

die() { echo "chromium: $*" >&2; exit 1; }

missing() {
    local i
    for i in "${!BINARIES[@]}"; do
        [[ -x ${BINARIES[$i]} ]] || echo "${PACKAGES[$i]}"
    done
}

versions() {
    "${BINARIES[0]}" --version 2>/dev/null | head -n 1
    "${BINARIES[1]}" --version | head -n 1
}

install() {
    local need
    mapfile -t need < <(missing)
    if ((${#need[@]} == 0)); then
        versions
        return 0
    fi
    [[ $(id -u) == 0 ]] || die "need root to install ${need[*]}; run: sudo apt-get install -y ${need[*]}"
    echo "chromium: installing ${need[*]}" >&2
    # apt-get waits for a concurrent apt run's lock for at most 300 s, then fails.
    apt-get -o DPkg::Lock::Timeout=300 update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q "${need[@]}"
    mapfile -t need < <(missing)
    ((${#need[@]} == 0)) || die "still missing after apt-get: ${need[*]}"
    versions
}

check() {
    local need
    mapfile -t need < <(missing)
    ((${#need[@]} == 0)) || die "missing: ${need[*]}; run: bash scripts/chromium.sh install"
    versions
}

case ${1:-} in
    install) install ;;
    check) check ;;
    *) die "usage: $0 install|check" ;;
esac
