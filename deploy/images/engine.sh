#!/bin/bash
# Make sure a container engine answers: Debian's docker.io, installed with apt-get when
# missing and started here in the background when not running. Idempotent; concurrent
# callers wait on one lock. Prints nothing when the engine already answers.
#
# The daemon runs with no bridge network and no iptables rules (builds and containers use
# the host's network), cgroupfs (no systemd here), fixed ulimits, and overlay2 when this
# filesystem can mount an overlay, else vfs. Its log: /var/log/directlog-dockerd.log.
set -euo pipefail

DOCKER=${DOCKER:-/usr/bin/docker}
DATA_ROOT=${DOCKER_DATA_ROOT:-/var/lib/docker}
LOG=/var/log/directlog-dockerd.log
LOCK=/run/directlog-engine.lock

answers() { "$DOCKER" info >/dev/null 2>&1; }

answers && exit 0

exec 9>"$LOCK"
flock 9
answers && exit 0

if ! command -v dockerd >/dev/null || ! [ -x "$DOCKER" ]; then
    echo "engine.sh: installing docker.io with apt-get"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io
    answers && exit 0  # a systemd host starts it on install
fi

# overlay2 when an overlay mounts on the data root's filesystem (not on every one, e.g.
# some overlay or network file systems); vfs, slow but universal, otherwise.
storage_driver() {
    local probe driver=vfs
    mkdir -p "$DATA_ROOT"
    probe=$(mktemp -d "$DATA_ROOT/.overlay-probe.XXXXXX")
    mkdir "$probe"/{lower,upper,work,merged}
    if mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" \
        "$probe/merged" 2>/dev/null; then
        umount "$probe/merged"
        driver=overlay2
    fi
    rm -rf "$probe"
    echo "$driver"
}

driver=${DOCKER_STORAGE_DRIVER:-$(storage_driver)}
echo "engine.sh: starting dockerd (storage driver $driver), log in $LOG"
setsid nohup dockerd \
    --data-root "$DATA_ROOT" \
    --storage-driver "$driver" \
    --exec-opt native.cgroupdriver=cgroupfs \
    --default-ulimit nofile=20000:20000 \
    --default-ulimit nproc=32768:32768 \
    --bridge=none --iptables=false --ip6tables=false \
    >>"$LOG" 2>&1 </dev/null &

for _ in $(seq 1 120); do
    answers && exit 0
    sleep 0.5
done
echo "engine.sh: dockerd did not answer within 60 s; the end of $LOG:" >&2
tail -n 30 "$LOG" >&2
exit 1
