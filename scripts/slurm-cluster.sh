#!/usr/bin/env bash
# Start, stop or check a one-machine Slurm cluster for fiberexec's Slurm tests.
#
#   scripts/slurm-cluster.sh start    install Debian's slurm-wlm and munge if missing, write a
#                                     slurm.conf, start munged, slurmctld and the slurmds, and
#                                     wait until every node is idle
#   scripts/slurm-cluster.sh stop     stop the daemons this script started (and only those)
#   scripts/slurm-cluster.sh status   exit 0 when every node answers and is idle
#   scripts/slurm-cluster.sh env      print `export SLURM_CONF=...` for a shell
#
# Everything lives in one state directory (config, munge key and socket, spool, logs, pid
# files), and the daemons use their own ports, so the cluster never touches /etc/slurm or a
# site's munged. Clients find it through SLURM_CONF=$DIR/slurm.conf (the tox env sets it).
#
# The cluster: NODES slurmd daemons on this host (NodeAddr=127.0.0.1, one port each), each
# declaring CPUS CPUs (SlurmdParameters=config_overrides, so light workers can outnumber the
# cores) and this machine's memory; select/cons_tres with cores and memory consumable, so
# --mem is a reservation; jobacct_gather/linux with OverMemoryKill, so a job whose processes
# use more than its --mem is killed and reported OUT_OF_MEMORY (no cgroups needed:
# ProctrackType=proctrack/linuxproc, TaskPlugin=task/none). Finished jobs stay visible to
# squeue for MinJobAge seconds; there is no accounting database (sacct is not available).
#
# Environment:
#   FIBEREXEC_SLURM_DIR     state directory            (default /var/lib/fiberexec-slurm)
#   FIBEREXEC_SLURM_NODES   slurmd daemons (nodes)      (default 2)
#   FIBEREXEC_SLURM_CPUS    CPUs each node declares     (default 16)
#   FIBEREXEC_SLURM_PORT    slurmctld port; slurmds use the next ones (default 16817)
#   FIBEREXEC_SLURM_WAIT    seconds to wait for idle nodes (default 60)
set -euo pipefail

DIR=${FIBEREXEC_SLURM_DIR:-/var/lib/fiberexec-slurm}
NODES=${FIBEREXEC_SLURM_NODES:-2}
CPUS=${FIBEREXEC_SLURM_CPUS:-16}
PORT=${FIBEREXEC_SLURM_PORT:-16817}
WAIT=${FIBEREXEC_SLURM_WAIT:-60}
CONF=$DIR/slurm.conf
MUNGE_SOCKET=$DIR/munge/munge.socket
export SLURM_CONF=$CONF

die() {
    echo "slurm-cluster: $*" >&2
    local log
    for log in "$DIR"/log/*.log; do
        [[ -f $log ]] || continue
        echo "--- last lines of $log ---" >&2
        tail -n 15 "$log" >&2
    done
    exit 1
}

install_missing() {
    local missing=()
    command -v munged >/dev/null || missing+=(munge)
    command -v slurmctld >/dev/null || missing+=(slurmctld)
    command -v slurmd >/dev/null || missing+=(slurmd)
    command -v sbatch >/dev/null || missing+=(slurm-client)
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "need root to install ${missing[*]}; run: sudo apt-get install -y ${missing[*]}"
    echo "slurm-cluster: installing ${missing[*]}" >&2
    # apt-get waits for a concurrent apt run's lock for at most 900 s, then fails.
    apt-get -o DPkg::Lock::Timeout=900 update -q
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q \
        --no-install-recommends "${missing[@]}"
}

node_names() {
    local i
    for ((i = 1; i <= NODES; i++)); do echo "fx$i"; done
}

memory_mb() { awk '/^MemTotal:/ {print int($2 / 1024) - 512}' /proc/meminfo; }

write_config() {
    local host mem node i=0
    host=$(hostname -s)
    mem=$(memory_mb)
    mkdir -p "$DIR"/{ctld,log,munge,spool}
    chmod 0700 "$DIR/munge"
    if [[ ! -s $DIR/munge/munge.key ]]; then
        head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
        chmod 0400 "$DIR/munge/munge.key"
    fi
    cat >"$CONF" <<EOF
# Written by scripts/slurm-cluster.sh: a test cluster on this machine only.
ClusterName=fiberexec
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
EOF
    for node in $(node_names); do
        i=$((i + 1))
        echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + i))" \
            "CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1" \
            "RealMemory=$mem State=UNKNOWN" >>"$CONF"
    done
    echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF"
    # A partition whose time limit a longer job can never fit: tests of jobs that cannot start.
    echo "PartitionName=short Nodes=ALL MaxTime=1 State=UP" >>"$CONF"
}

alive() { [[ -f $1 ]] && kill -0 "$(<"$1")" 2>/dev/null; }

start_munged() {
    alive "$DIR/munge/munged.pid" && return 0
    munged --socket="$MUNGE_SOCKET" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed" --force \
        || die "munged did not start"
}

start_daemons() {
    local node
    start_munged
    # -i: ignore state left by an earlier run; both daemons fork into the background.
    alive "$DIR/slurmctld.pid" || slurmctld -i -f "$CONF" || die "slurmctld did not start"
    for node in $(node_names); do
        mkdir -p "$DIR/spool/$node"
        alive "$DIR/slurmd-$node.pid" || slurmd -f "$CONF" -N "$node" \
            || die "slurmd for node $node did not start"
    done
}

idle_nodes() { timeout 10 sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l; }

wait_idle() {
    # Bounded wait: one sinfo per second, at most $WAIT times.
    local i
    for ((i = 0; i < WAIT; i++)); do
        (($(idle_nodes) == NODES)) && return 0
        alive "$DIR/slurmctld.pid" || die "slurmctld exited during startup"
        sleep 1
    done
    die "not all $NODES nodes idle within ${WAIT}s: $(sinfo -N 2>&1 | tr '\n' ';')"
}

start() {
    install_missing
    write_config
    start_daemons
    wait_idle
    echo "slurm-cluster: $NODES nodes idle (SLURM_CONF=$CONF, logs in $DIR/log)" >&2
}

stop_one() {
    local pidfile=$1 pid i
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(<"$pidfile")
    kill -TERM "$pid"
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
        sleep 0.2
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

stop() {
    local node
    if alive "$DIR/slurmctld.pid"; then
        # Jobs left by a failed test would keep their processes: cancel them first.
        timeout 10 scancel --full --user="$(id -un)" 2>/dev/null || true
    fi
    for node in $(node_names); do stop_one "$DIR/slurmd-$node.pid"; done
    stop_one "$DIR/slurmctld.pid"
    stop_one "$DIR/munge/munged.pid"
    echo "slurm-cluster: stopped" >&2
}

status() {
    if [[ -f $CONF ]] && (($(idle_nodes) == NODES)); then
        echo "slurm-cluster: running, $NODES nodes idle" >&2
    else
        echo "slurm-cluster: not running (start it with: $0 start)" >&2
        return 1
    fi
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
