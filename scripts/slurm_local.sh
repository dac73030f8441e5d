#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for trying bsexp's SLURM launcher and for its tests
# (tests/slurm). Debian's packages (slurm-wlm 22.05: slurmctld, slurmd, slurm-client; munge;
# slurmdbd + MariaDB for the accounting that submitit reads job states from), loopback only.
# Daemons are started and stopped by their PIDs (no systemd); configuration, state and logs live
# in one directory, $BSEXP_SLURM_DIR (default /tmp/bsexp-slurm). Run as root.
#
#   scripts/slurm_local.sh install   # apt-get the packages (start does it when they are missing)
#   scripts/slurm_local.sh start     # idempotent; prints the SLURM_CONF every client needs
#   export SLURM_CONF=/tmp/bsexp-slurm/etc/slurm.conf
#   scripts/slurm_local.sh status    # exit 0 when the node takes jobs
#   scripts/slurm_local.sh stop      # cancels jobs, stops the daemons, removes the directory
set -euo pipefail

DIR=${BSEXP_SLURM_DIR:-/tmp/bsexp-slurm}
CONF=$DIR/etc/slurm.conf
CLUSTER=bsexp
# Ports away from SLURM's and MariaDB's defaults, so a real installation can live beside this one.
CTLD_PORT=${BSEXP_SLURM_PORT:-16817}
SLURMD_PORT=$((CTLD_PORT + 1))
DBD_PORT=$((CTLD_PORT + 2))
DB_PORT=$((CTLD_PORT - 511))      # 16306 by default
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
COMMANDS=(slurmctld slurmd sbatch srun sacct sacctmgr scontrol slurmdbd munged mariadbd mariadb-install-db)
# The order they start in; stop goes the other way.
DAEMONS=(munged mariadb slurmdbd slurmctld slurmd)

export SLURM_CONF=$CONF

say() { echo "slurm_local: $*"; }
die() { echo "slurm_local: error: $*" >&2; exit 2; }

need_root() { [[ $(id -u) == 0 ]] || die "run as root (the daemons run as root, munged as munge, MariaDB as mysql)"; }

missing_commands() {
    local c out=()
    for c in "${COMMANDS[@]}"; do command -v "$c" >/dev/null 2>&1 || out+=("$c"); done
    echo "${out[*]:-}"
}

install() {
    need_root
    [[ -z $(missing_commands) ]] && { say "packages already installed ($(slurmctld -V))"; return; }
    command -v apt-get >/dev/null || die "apt-get not found: install ${PACKAGES[*]} (SLURM 22.05) by hand"
    say "installing ${PACKAGES[*]}"
    local policy=/usr/sbin/policy-rc.d ours=""
    if [[ ! -e $policy ]]; then  # the packages' scripts must not start daemons: this script does
        printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && ours=1
    fi
    local rc=0
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${PACKAGES[@]}"; } > "${TMPDIR:-/tmp}/bsexp-slurm-apt.log" 2>&1 || rc=$?
    [[ -n $ours ]] && rm -f "$policy"
    [[ $rc == 0 ]] || { tail -20 "${TMPDIR:-/tmp}/bsexp-slurm-apt.log" >&2; die "apt-get failed (exit $rc)"; }
    [[ -z $(missing_commands) ]] || die "still missing after install: $(missing_commands)"
    say "installed $(slurmctld -V)"
}

pid_of() { [[ -s $DIR/run/$1.pid ]] && cat "$DIR/run/$1.pid"; }
alive() { local pid; pid=$(pid_of "$1") && [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
    local seconds=$1 what=$2 i
    shift 2
    for ((i = 0; i < seconds * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    say "$what did not come up in ${seconds}s; the end of its log:"
    tail -20 "$DIR/log/$what.log" 2>/dev/null >&2 || true
    die "$what did not start (logs in $DIR/log)"
}

write_config() {
    local host node_line mem
    host=$(hostname -s)
    mkdir -p "$DIR"/{etc,run,log,state,spool}
    chmod 755 "$DIR"
    # The node as slurmd sees it (CPUs, sockets, memory), reached on loopback.
    node_line=$(slurmd -C | head -1)
    mem=$(awk '/^MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    node_line=$(sed -E "s/RealMemory=[0-9]+/RealMemory=$mem/" <<<"$node_line")
    cat > "$CONF" <<EOF
# Written by scripts/slurm_local.sh: one node, loopback only.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits cred_expire + 1 s before it may start again (default 120 s; 5 is the least).
AuthInfo=cred_expire=5
# No cgroups here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=10
MinJobAge=600
InactiveLimit=0
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# Accounting: submitit reads job states with sacct.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    cat > "$DIR/etc/slurmdbd.conf" <<EOF
# Written by scripts/slurm_local.sh.
AuthType=auth/munge
DbdHost=$host
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$DIR/etc/slurmdbd.conf"  # slurmdbd refuses a readable one (it holds a password)
}

db() { mariadb --no-defaults --socket="$DIR/mysql/mysqld.sock" -u root "$@"; }

start_munged() {
    if alive munged; then return; fi
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        say "munged: one is running already (not ours); using it"
        return
    fi
    # The package creates the key; munged runs as munge, with /run/munge its own.
    mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
    touch "$DIR/log/munged.log" && chown munge:munge "$DIR/log/munged.log"
    runuser -u munge -- munged --pid-file=/run/munge/munged.pid --log-file="$DIR/log/munged.log" \
        || die "munged did not start (see $DIR/log/munged.log)"
    wait_for 10 munged bash -c 'munge -n | unmunge'
    cp /run/munge/munged.pid "$DIR/run/munged.pid"
}

start_mariadb() {
    if alive mariadb; then return; fi
    if [[ ! -d $DIR/mysql/mysql ]]; then
        mariadb-install-db --no-defaults --user=mysql --datadir="$DIR/mysql" --skip-test-db \
            --auth-root-authentication-method=socket > "$DIR/log/mariadb-install.log" 2>&1 \
            || { tail -20 "$DIR/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi
    touch "$DIR/log/mariadb.log" && chown mysql:mysql "$DIR/log/mariadb.log"
    setsid mariadbd --no-defaults --user=mysql --datadir="$DIR/mysql" --socket="$DIR/mysql/mysqld.sock" \
        --pid-file="$DIR/mysql/mariadbd.pid" --port="$DB_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 --log-error="$DIR/log/mariadb.log" \
        < /dev/null > /dev/null 2>&1 &
    echo $! > "$DIR/run/mariadb.pid"
    wait_for 60 mariadb db -e "SELECT 1"
    db -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
           CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
}

start_slurmdbd() {
    if alive slurmdbd; then return; fi
    slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF; daemonises and writes its PidFile
    wait_for 30 slurmdbd sacctmgr -n show cluster
    if ! sacctmgr -n -P show cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" > /dev/null
    fi
}

node_state() { sinfo -h -N -o %T 2>/dev/null | head -1; }

start_slurmctld() {
    if alive slurmctld; then return; fi
    slurmctld -i  # -i: ignore unreadable state left by an earlier run
    wait_for 30 slurmctld bash -c 'scontrol ping | grep -q UP'
}

start_slurmd() {
    if alive slurmd; then return; fi
    slurmd
    wait_for 30 slurmd bash -c '[[ $(sinfo -h -N -o %T 2>/dev/null | head -1) == idle* ]] ||
                               [[ $(sinfo -h -N -o %T 2>/dev/null | head -1) == mixed* ]] ||
                               [[ $(sinfo -h -N -o %T 2>/dev/null | head -1) == allocated* ]]'
}

start() {
    need_root
    [[ -z $(missing_commands) ]] || install
    if status > /dev/null 2>&1; then
        say "already running"
    else
        [[ -f $CONF ]] || write_config
        local d
        for d in "${DAEMONS[@]}"; do "start_$d"; done
        say "up: node $(hostname -s) $(node_state), $(sinfo -h -N -o '%c CPUs, %m MB') ($DIR)"
    fi
    echo "export SLURM_CONF=$CONF"
}

stop_pid() {  # stop_pid NAME: SIGTERM, then SIGKILL after 20 s
    local name=$1 pid i
    pid=$(pid_of "$name") || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        if kill -0 "$pid" 2>/dev/null; then
            say "$name ($pid) ignored SIGTERM; SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$DIR/run/$name.pid"
}

ours() {  # PIDs left by this cluster's jobs: slurmstepd (it clears its environment, but works in
    # our log directory) and the jobs' processes (a job id, and this cluster's conf, in their environment)
    local p env
    for p in /proc/[0-9]*; do
        [[ ${p#/proc/} == "$$" ]] && continue
        if [[ $({ tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null) == slurmstepd* &&
            $(readlink "$p/cwd" 2>/dev/null) == "$DIR"/* ]]; then
            echo "${p#/proc/}"
            continue
        fi
        env=$({ tr '\0' '\n' < "$p/environ"; } 2>/dev/null) || continue
        if grep -q "^SLURM_JOB_ID=" <<<"$env" && grep -qx "SLURM_CONF=$CONF" <<<"$env"; then
            echo "${p#/proc/}"
        fi
    done
    return 0
}

stop() {
    need_root
    if [[ ! -d $DIR ]]; then say "not running (no $DIR)"; return; fi
    if alive slurmctld; then  # end the jobs first, so that no job outlives its node
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        [[ -z ${jobs// /} ]] || scancel $jobs 2>/dev/null || true
        local i
        for ((i = 0; i < 75; i++)); do
            [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    local d
    for ((d = ${#DAEMONS[@]} - 1; d >= 0; d--)); do stop_pid "${DAEMONS[d]}"; done
    local left
    left=$(ours | tr '\n' ' ')
    if [[ -n ${left// /} ]]; then  # job steps whose slurmd has gone (slurmstepd, the job's processes)
        say "ending leftover job processes: $left"
        kill -KILL $left 2>/dev/null || true
    fi
    rm -rf "$DIR"
    say "stopped"
}

status() {
    local d bad=0 pid
    for d in "${DAEMONS[@]}"; do
        if alive "$d"; then
            echo "$d running (pid $(pid_of "$d"))"
        elif [[ $d == munged ]] && munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            echo "munged running (not ours)"
        else
            echo "$d not running"
            bad=1
        fi
    done
    if [[ $bad == 0 ]]; then
        sinfo -N -o '%N %P %T %c %m' 2>/dev/null || bad=1
        case $(node_state) in idle* | mixed* | allocated* | completing*) ;; *) bad=1 ;; esac
    fi
    [[ $bad == 0 ]] && echo "export SLURM_CONF=$CONF"
    return $bad
}

case ${1:-} in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 install|start|stop|status   (state in $DIR; run as root)" >&2; exit 2 ;;
esac
