#!/usr/bin/env bash
# Prepare or clean up the machine for fiberexec's multi-host test bed (tests/testbed).
#
#   scripts/ssh-testbed.sh install   install openssh-server, openssh-client, iproute2, nftables,
#                                    procps (sysctl) and openssl (test certificates) when
#                                    missing (Debian 12, as root); never starts a system sshd
#   scripts/ssh-testbed.sh clean     remove test-bed network namespaces (fxtb-*) whose test run
#                                    is gone, killing what still runs inside them
#   scripts/ssh-testbed.sh check     exit 0 when everything the test bed needs is present
#   scripts/ssh-testbed.sh run -- CMD...
#                                    run CMD in a mount namespace of its own with a private
#                                    /dev/shm: the executor host, like each worker host, then
#                                    has its own shared memory (and other programs' files in
#                                    the machine's /dev/shm are out of sight); network
#                                    namespaces made inside vanish with it
#
# The test bed itself (namespaces, sshd per worker host) is created and removed by the pytest
# session fixture in tests/testbed/; this script only installs packages and sweeps up after a
# run that was killed before its fixture could clean up.
set -euo pipefail

POLICY=/usr/sbin/policy-rc.d
MADE_POLICY=0

die() { echo "ssh-testbed: $*" >&2; exit 1; }

have_all() {
    [[ -x /usr/sbin/sshd ]] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null &&
        command -v ip >/dev/null && command -v tc >/dev/null && command -v nft >/dev/null &&
        command -v sysctl >/dev/null && command -v openssl >/dev/null &&
        command -v unshare >/dev/null && command -v nsenter >/dev/null
}

install_missing() {
    have_all && return 0
    [[ $(id -u) == 0 ]] || die "need root to install packages; run: sudo $0 install"
    if [[ ! -e $POLICY ]]; then
        # Keep the package from starting a system-wide sshd: the test bed runs its own.
        printf '#!/bin/sh\nexit 101\n' >"$POLICY" && chmod 755 "$POLICY" && MADE_POLICY=1
    fi
    trap 'if [[ $MADE_POLICY == 1 ]]; then rm -f "$POLICY"; fi' EXIT
    echo "ssh-testbed: installing openssh-server openssh-client iproute2 nftables procps" \
        "openssl util-linux" >&2
    apt-get -o DPkg::Lock::Timeout=900 update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
        --no-install-recommends openssh-server openssh-client iproute2 nftables procps \
        openssl util-linux
    have_all || die "packages installed but sshd, ssh, ip, tc, nft, sysctl, openssl," \
        "unshare or nsenter is still missing"
}

clean_stale() {
    local ns pid
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fxtb-[0-9]+-' || true); do
        pid=${ns#fxtb-}
        pid=${pid%%-*}
        if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
            continue  # its test run is still alive: not ours to remove
        fi
        for p in $(ip netns pids "$ns" 2>/dev/null || true); do
            kill -KILL "$p" 2>/dev/null || true
        done
        ip netns delete "$ns" 2>/dev/null || true
        echo "ssh-testbed: removed stale namespace $ns" >&2
    done
    # The sshd of a bed whose session was killed outlives the namespaces above: `run` made
    # them inside a mount namespace of its own, so out here their names are empty files and
    # list no process. It is known by its configuration's folder and by its parent being
    # gone (init adopted it); it goes with what it started, and so does the folder.
    local dir
    for pid in $(pgrep -f '^sshd: /usr/sbin/sshd .*-f /tmp/fxtb-ssh-' || true); do
        [[ $(ps -o ppid= -p "$pid" 2>/dev/null | tr -d ' ') == 1 ]] || continue
        dir=$(ps -o args= -p "$pid" | sed -n 's|.*-f \(/tmp/fxtb-ssh-[A-Za-z0-9_]*\)/.*|\1|p')
        pkill -KILL -P "$pid" 2>/dev/null || true
        kill -KILL "$pid" 2>/dev/null || true
        [[ -n $dir ]] && rm -rf "$dir"
        echo "ssh-testbed: killed the sshd $pid a killed test run left (${dir:-?})" >&2
    done
}

case "${1:-}" in
    install) install_missing; clean_stale ;;
    clean) clean_stale ;;
    check) have_all ;;
    run)
        shift
        [[ ${1:-} == -- ]] && shift
        (($# > 0)) || die "usage: $0 run -- COMMAND [ARGS...]"
        exec unshare --mount --propagation private sh -c \
            'mount -t tmpfs -o mode=1777,size=1g fxtb-shm /dev/shm && exec "$@"' sh "$@" ;;
    *) die "usage: $0 install|clean|check|run -- CMD" ;;
esac
