#!/usr/bin/env bash
# Start, stop or check a local Docker engine for fiberexec's Docker tests.
#
#   scripts/docker-engine.sh start    install docker.io/debootstrap if missing, start dockerd
#   scripts/docker-engine.sh stop     stop the dockerd this script started (and only that one)
#                                     once no other user holds a lease on it
#   scripts/docker-engine.sh status   exit 0 when `docker info` answers
#
# Several test runs may share one engine at the same time (two tox envs, two checkouts):
# `start` and `stop` serialise on a lock file, `start` takes a lease for the calling process
# (tox, or your shell: $PPID, or FIBEREXEC_DOCKERD_LEASE), and `stop` drops that lease and
# stops the engine only when no lease of a live process is left. So `start` is idempotent and
# one run's `stop` never pulls the engine from under another run.
# dockerd runs without a bridge or iptables rules (`--bridge=none --iptables=false
# --ip-masq=false`): fiberexec containers use host networking and talk to loopback only.
# Environment:
#   FIBEREXEC_DOCKERD_LOG   dockerd's log file   (default /tmp/fiberexec-dockerd.log)
#   FIBEREXEC_DOCKERD_PID   pid file of our dockerd (default /tmp/fiberexec-dockerd.pid)
#   FIBEREXEC_DOCKERD_WAIT  seconds to wait for the engine to answer (default 60)
#   FIBEREXEC_DOCKERD_LEASE pid that holds this caller's lease (default: the parent, $PPID)
set -euo pipefail

LOG=${FIBEREXEC_DOCKERD_LOG:-/tmp/fiberexec-dockerd.log}
PIDFILE=${FIBEREXEC_DOCKERD_PID:-/tmp/fiberexec-dockerd.pid}
WAIT=${FIBEREXEC_DOCKERD_WAIT:-60}
LOCK=$PIDFILE.lock
LEASES=$PIDFILE.leases
LEASE=${FIBEREXEC_DOCKERD_LEASE:-$PPID}

die() {
    echo "docker-engine: $*" >&2
    if [[ -f $LOG ]]; then
        echo "--- last lines of $LOG ---" >&2
        tail -n 30 "$LOG" >&2
    fi
    exit 1
}

engine_up() { timeout 10 docker info >/dev/null 2>&1; }

install_missing() {
    local missing=()
    command -v dockerd >/dev/null || missing+=(docker.io)
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "need root to install ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    echo "docker-engine: installing ${missing[*]}" >&2
    # apt-get waits for a concurrent apt run's lock for at most 300 s, then fails.
    apt-get -o DPkg::Lock::Timeout=300 update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -q "${missing[@]}"
}

our_pid() {
    [[ -f $PIDFILE ]] || return 1
    local pid
    pid=$(<"$PIDFILE")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

wait_until_up() {
    # Bounded wait: one `docker info` per second, at most $WAIT times.
    local pid=$1 i
    for ((i = 0; i < WAIT; i++)); do
        engine_up && return 0
        kill -0 "$pid" 2>/dev/null || die "dockerd (pid $pid) exited during startup"
        sleep 1
    done
    die "dockerd did not answer within ${WAIT}s (set FIBEREXEC_DOCKERD_WAIT to wait longer)"
}

lock_holders() {
    # "pid command" of every process with the lock file open.
    local fd
    for fd in /proc/[0-9]*/fd/*; do
        [[ $(readlink "$fd" 2>/dev/null) == "$LOCK" ]] || continue
        fd=${fd#/proc/}
        echo "${fd%%/*} $(tr '\0' ' ' <"/proc/${fd%%/*}/cmdline" 2>/dev/null | cut -c1-60)"
    done | sort -u
}

locked() {
    # Serialise start/stop between concurrent callers; waits at most 300 s for the lock.
    exec 9>"$LOCK"
    if ! flock -w 300 9; then
        exec 9>&-  # so that only other processes are named below
        die "the lock $LOCK was held for 300s by: $(lock_holders | tr '\n' ';') \
a docker-engine.sh still running, or a dockerd started by a version of this script that let \
it inherit the lock (stop that dockerd with kill -TERM <pid>)"
    fi
    "$@"
}

take_lease() { mkdir -p "$LEASES" && : >"$LEASES/$LEASE"; }

live_leases() {
    # Leases of processes still alive; those of dead ones (a run killed before `stop`) go.
    local lease pid
    for lease in "$LEASES"/*; do
        [[ -e $lease ]] || continue
        pid=${lease##*/}
        if kill -0 "$pid" 2>/dev/null; then echo "$pid"; else rm -f "$lease"; fi
    done
}

start() {
    if engine_up; then
        our_pid >/dev/null && take_lease
        echo "docker-engine: engine already running" >&2
        return 0
    fi
    install_missing
    local pid
    if pid=$(our_pid); then
        wait_until_up "$pid"
        take_lease
        return 0
    fi
    : >"$LOG"
    rm -rf "$LEASES"
    # setsid: dockerd outlives this shell and is not hit by a terminal's Ctrl-C.
    # 9>&-: the daemon must not inherit the lock, or it would hold it for its whole life.
    setsid dockerd --bridge=none --iptables=false --ip-masq=false >>"$LOG" 2>&1 </dev/null 9>&- &
    pid=$!
    echo "$pid" >"$PIDFILE"
    wait_until_up "$pid"
    take_lease
    echo "docker-engine: dockerd running (pid $pid, log $LOG)" >&2
}

stop() {
    local pid i others
    rm -f "$LEASES/$LEASE"
    if ! pid=$(our_pid); then
        echo "docker-engine: no dockerd started by this script is running" >&2
        rm -f "$PIDFILE"
        return 0
    fi
    others=$(live_leases | tr '\n' ' ')
    if [[ -n $others ]]; then
        echo "docker-engine: dockerd (pid $pid) still in use by pid(s) ${others% }; left running" >&2
        return 0
    fi
    kill -TERM "$pid"
    for ((i = 0; i < 30; i++)); do
        kill -0 "$pid" 2>/dev/null || { rm -rf "$PIDFILE" "$LEASES"; echo "docker-engine: stopped" >&2; return 0; }
        sleep 1
    done
    die "dockerd (pid $pid) did not stop within 30s; kill it with: kill -KILL $pid"
}

status() {
    if engine_up; then
        echo "docker-engine: running" >&2
    else
        echo "docker-engine: not running (start it with: $0 start)" >&2
        return 1
    fi
}

case ${1:-} in
    start) locked start ;;
    stop) locked stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
