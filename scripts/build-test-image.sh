#!/usr/bin/env bash
# Build the image fiberexec's Docker tests run workers in, without any container registry.
#
#   scripts/build-test-image.sh [TAG]        (default TAG: fiberexec-test:latest)
#   scripts/build-test-image.sh --base-only  build (or find) layer 1 only and print its tag
#
# Layers, each rebuilt only when its inputs change:
#   1. fiberexec-base:<key>  Debian bookworm (minbase + python3, python3-venv) made by
#                            debootstrap and `docker import`ed; the rootfs tarball is cached.
#   2. dependencies          /opt/venv with the project's dependencies + numpy, installed
#                            offline from wheels that pip downloads on the host (host pip
#                            settings, CA bundle and indexes apply there, not in the build).
#   3. project               a wheel of this checkout (`pip wheel --no-deps`).
# The finished image is labelled with the dependency and source keys; when both match the
# existing TAG, nothing is rebuilt. PATH starts with /opt/venv/bin, so
# `python -m fiberexec.worker` works. Needs root (debootstrap), a running engine
# (scripts/docker-engine.sh start), the Debian mirror and a Python package index.
# Environment:
#   FIBEREXEC_IMAGE_CACHE  cache directory     (default ~/.cache/fiberexec-image)
#   FIBEREXEC_DEBIAN_MIRROR                    (default http://deb.debian.org/debian)
#   FIBEREXEC_TEST_EXTRA   extra requirements  (default "numpy joblib")
set -euo pipefail

BASE_ONLY=0
if [[ ${1:-} == --base-only ]]; then
    BASE_ONLY=1
    shift
fi
TAG=${1:-fiberexec-test:latest}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${FIBEREXEC_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fiberexec-image}
MIRROR=${FIBEREXEC_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
PACKAGES=python3,python3-venv
EXTRA=${FIBEREXEC_TEST_EXTRA:-numpy joblib}
PYTHON=${PYTHON:-python3}

log() { echo "build-test-image: $*" >&2; }
die() { log "$*"; exit 1; }
key_of() { sha256sum | cut -c1-16; }

mkdir -p "$CACHE"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fiberexec-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

timeout 10 docker info >/dev/null 2>&1 || die "the Docker engine is not reachable; run scripts/docker-engine.sh start"

# --- 1. base image ------------------------------------------------------------------------
BASE_KEY=$(printf '%s\n' v1 "$SUITE" minbase "$PACKAGES" "$MIRROR" | key_of)
BASE=fiberexec-base:$BASE_KEY

build_base() {
    local tarball=$CACHE/rootfs-$BASE_KEY.tar
    if [[ ! -s $tarball ]]; then
        command -v debootstrap >/dev/null || die "debootstrap is missing; run: apt-get install -y debootstrap"
        log "debootstrap $SUITE ($PACKAGES) from $MIRROR; this takes a few minutes once"
        local rootfs=$WORK/rootfs
        debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
            >"$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
        rm -rf "$rootfs"
    fi
    log "importing $tarball as $BASE"
    docker import "$tarball" "$BASE" >/dev/null
}

docker image inspect "$BASE" >/dev/null 2>&1 || build_base
if ((BASE_ONLY)); then
    echo "$BASE"
    exit 0
fi

# --- 2. dependency wheels (downloaded on the host) ---------------------------------------
CTX=$WORK/context
mkdir -p "$CTX/deps" "$CTX/project"
"$PYTHON" - "$ROOT/pyproject.toml" "$EXTRA" >"$CTX/deps/requirements.txt" <<'EOF'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
print("\n".join(sorted(deps + sys.argv[2].split())))
EOF
DEPS_KEY=$( (echo "$BASE_KEY"; cat "$CTX/deps/requirements.txt") | key_of)
WHEELS=$CACHE/wheels-$DEPS_KEY
if [[ ! -f $WHEELS/.complete ]]; then
    log "downloading dependency wheels into $WHEELS"
    rm -rf "$WHEELS"
    "$PYTHON" -m pip wheel -q --wheel-dir "$WHEELS" -r "$CTX/deps/requirements.txt" \
        >"$WORK/deps.log" 2>&1 || { tail -n 30 "$WORK/deps.log" >&2; die "could not download dependency wheels"; }
    touch "$WHEELS/.complete"
fi
cp "$WHEELS"/*.whl "$CTX/deps/"

# --- 3. project -------------------------------------------------------------------------
SRC_KEY=$( (cd "$ROOT" && find pyproject.toml fiberexec/ backends/ -name __pycache__ -prune -o \
    -type f -print | LC_ALL=C sort | xargs sha256sum) | key_of)
if [[ $(docker image inspect -f '{{index .Config.Labels "fiberexec.deps"}}/{{index .Config.Labels "fiberexec.source"}}' "$TAG" 2>/dev/null) == "$DEPS_KEY/$SRC_KEY" ]]; then
    log "$TAG is up to date (deps $DEPS_KEY, source $SRC_KEY)"
    echo "$TAG"
    exit 0
fi
# Build from a copy so setuptools leaves no build/ or *.egg-info behind in the checkout.
mkdir "$WORK/src"
(cd "$ROOT" && tar -c --exclude=__pycache__ pyproject.toml fiberexec backends \
    $(ls README* LICENSE* 2>/dev/null)) | tar -C "$WORK/src" -x
"$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$CTX/project" "$WORK/src" >"$WORK/wheel.log" 2>&1 \
    || { tail -n 30 "$WORK/wheel.log" >&2; die "could not build a wheel of $ROOT"; }

cat >"$CTX/Dockerfile" <<EOF
FROM $BASE
RUN python3 -m venv /opt/venv
COPY deps/ /tmp/deps/
RUN /opt/venv/bin/pip install -q --no-index --no-cache-dir --find-links /tmp/deps \\
        -r /tmp/deps/requirements.txt && rm -rf /tmp/deps
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY project/ /tmp/project/
RUN pip install -q --no-index --no-deps --no-cache-dir /tmp/project/*.whl && rm -rf /tmp/project
LABEL fiberexec.deps=$DEPS_KEY fiberexec.source=$SRC_KEY
CMD ["python", "-m", "fiberexec.worker"]
EOF
log "building $TAG"
DOCKER_BUILDKIT=0 docker build -q --network host -t "$TAG" "$CTX" >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log" >&2; die "docker build failed"; }
docker image prune -f --filter label=fiberexec.deps >/dev/null 2>&1 || true
echo "$TAG"
