#!/usr/bin/env bash
# The compose stack's images, built here with podman where no image registry is reachable:
#   deploy/local/images.sh build   — build what is missing, then print the environment the compose
#                                    stack and tests/test_stack.py read (eval it)
#   deploy/local/images.sh env     — that environment only
#
# Each image is built FROM a Debian bookworm base made here with debootstrap (minbase, python3); dinrec's
# wheels come from a wheelhouse downloaded from PyPI once per requirements.lock, Kafka's jars from the
# folder deploy/local/services.sh resolves with Maven. The base, the wheelhouse and podman's layers are
# cached outside the clone, keyed on the files they come from, so a rebuild with nothing changed is a
# few seconds and a source change rebuilds only dinrec's last layers.
#
# podman on a VM without systemd as PID 1: containers.conf (written here, CONTAINERS_CONF) picks runc and
# cgroupfs, files for events, and explicit nofile/nproc ulimits (the VM refuses podman's defaults).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
STATE="${DINREC_IMAGES_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/dinrec/images}"
mkdir -p "$STATE"

log() { printf '[images] %s\n' "$*" >&2; }
key() { cat "$@" | sha256sum | cut -c1-12; }

CONF="$STATE/containers.conf"
cat >"$CONF" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:20000", "nproc=1024:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF="$CONF"

SUITE=bookworm
BASE_PACKAGES=python3,python3-venv,ca-certificates
BASE_KEY="$(printf '%s %s' "$SUITE" "$BASE_PACKAGES" | sha256sum | cut -c1-12)"
BASE="localhost/dinrec-base:$SUITE-$BASE_KEY"
LOCK="$ROOT/deploy/docker/requirements.lock"
WHEELS="$STATE/wheelhouse-$(key "$LOCK")"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$HERE/pom.xml")"
IMAGE="localhost/dinrec:dev"
REDIS_IMAGE="localhost/dinrec-redis:7.0-$BASE_KEY"
KAFKA_IMAGE="localhost/dinrec-kafka:$KAFKA_VERSION-$BASE_KEY"

need() {
  if command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null; then return; fi
  log "installing podman, runc and debootstrap (Debian packages)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap) >/dev/null
}

base() {
  if podman image exists "$BASE"; then return; fi
  log "making the Debian $SUITE base with debootstrap (once)"
  local dir="$STATE/rootfs-$BASE_KEY"
  rm -rf "$dir"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$dir" http://deb.debian.org/debian >"$STATE/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE/debootstrap.log" >&2; return 1; }
  rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
  tar -C "$dir" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$BASE" >/dev/null
  rm -rf "$dir"
}

wheelhouse() {
  if [[ -f "$WHEELS/.complete" ]]; then return; fi
  log "downloading the wheelhouse for requirements.lock from PyPI (once per lock)"
  rm -rf "$WHEELS"
  # For this machine's Python and platform: the base is this machine's Debian release and Python minor.
  python3 -m pip download -q --only-binary=:all: -r "$LOCK" -d "$WHEELS" >&2
  # ... and what only the base's Python needs (a marker false here: requirements.lock says which).
  local other
  other="$(grep -v '^#' "$LOCK" | grep ';' | sed 's/ *;.*//' || true)"
  if [[ -n "$other" ]]; then
    # shellcheck disable=SC2086 - one requirement per word
    python3 -m pip download -q --only-binary=:all: --no-deps -d "$WHEELS" $other >&2
  fi
  touch "$WHEELS/.complete"
}

prune_if_full() {
  # Stale layers (an older lock's, a failed build's) are only reclaimed when space runs short: pruning
  # also drops the build cache, so the next build starts from the base (4-5 minutes).
  local free
  free="$(df --output=avail -k "$(podman info --format '{{.Store.GraphRoot}}')" | tail -1)"
  if ((free < 20 * 1024 * 1024)); then
    log "under 20 GB free: pruning podman's unused images (the next build is a cold one)"
    podman image prune -f >/dev/null
  fi
}

build() {
  need
  prune_if_full
  base
  wheelhouse
  local jars  # services.sh resolves them (once) and names their folder: Kafka's version and the pom's hash
  jars="$("$HERE/services.sh" kafka-jars)"
  log "building $IMAGE"
  podman build -q --format docker -f "$ROOT/deploy/docker/Dockerfile" --build-arg BASE="$BASE" -v "$WHEELS:/wheels:ro" \
    -t "$IMAGE" "$ROOT" >/dev/null
  log "building $REDIS_IMAGE"
  podman build -q --format docker -f "$ROOT/deploy/docker/redis.Dockerfile" --build-arg BASE="$BASE" -t "$REDIS_IMAGE" \
    "$ROOT/deploy/docker" >/dev/null
  log "building $KAFKA_IMAGE"
  podman build -q --format docker -f "$ROOT/deploy/docker/kafka.Dockerfile" --build-arg BASE="$BASE" \
    --build-arg KAFKA_JARS="$(basename "$jars")" -v "$jars:/jars:ro" -t "$KAFKA_IMAGE" "$ROOT/deploy/docker" >/dev/null
}

print_env() {
  echo "export CONTAINERS_CONF=$CONF"
  echo "export DINREC_IMAGE=$IMAGE"
  echo "export DINREC_REDIS_IMAGE=$REDIS_IMAGE"
  echo "export DINREC_KAFKA_IMAGE=$KAFKA_IMAGE"
}

case "${1:-}" in
  build) build; print_env ;;
  env) print_env ;;
  *) echo "usage: $0 build|env" >&2; exit 2 ;;
esac
