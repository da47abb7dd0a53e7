#!/usr/bin/env bash
# Run the README's two quick-start commands as a new user would: from a clean copy of this
# checkout, in a fresh Debian 12 container with Debian's own python3 (3.11, PEP 668: no
# system-wide pip), with nothing else installed.
#
#   scripts/check-setup.sh
#
# The container is `fiberexec-base` from scripts/build-test-image.sh --base-only: debootstrap
# minbase + python3 + python3-venv (the one package the README asks Debian users to add),
# imported without any registry. The commands are read from the README's "Quick start" block,
# so the check follows the README. The first runs as written (install, then the demo); the
# second runs with `-e lint` appended, so the container builds the tox env a fresh machine would
# and runs ruff and mypy in it, but not the suites the other tox envs already run here.
# Packages come from the package index, as on a fresh machine; this host's pip index and CA
# settings (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_CERT/SSL_CERT_FILE) are passed on when set.
# Needs a running engine (scripts/docker-engine.sh start). Exits non-zero with the container's
# output when a command fails.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LIMIT=${FIBEREXEC_SETUP_TIMEOUT:-600}

log() { echo "check-setup: $*" >&2; }
die() { log "$*"; exit 1; }

timeout 10 docker info >/dev/null 2>&1 || die "the Docker engine is not reachable; run scripts/docker-engine.sh start"

mapfile -t COMMANDS < <(awk '/^## Quick start/ {q = 1} q && /^```bash/ {b = 1; next}
    b && /^```/ {exit} b && NF {print}' "$ROOT/README.md")
((${#COMMANDS[@]} == 2)) || die "expected two commands in the README's Quick start block, found ${#COMMANDS[@]}"
INSTALL=${COMMANDS[0]}
TEST=${COMMANDS[1]}
[[ $TEST == *tox ]] || die "the README's second command should end by running tox, got: $TEST"

BASE=$(bash "$ROOT/scripts/build-test-image.sh" --base-only | tail -n 1)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fiberexec-setup.XXXXXX")
NAME=fiberexec-setup-$$
cleanup() {
    docker rm --force "$NAME" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# A clean copy: the files git tracks (and any not yet committed), no .tox/.venv/caches.
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 tar -cf "$WORK/src.tar" --)

ENV_ARGS=()
CA_ARGS=()
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL PIP_DEFAULT_TIMEOUT; do
    [[ -n ${!var:-} ]] && ENV_ARGS+=(-e "$var")
done
CA=${PIP_CERT:-${SSL_CERT_FILE:-}}
if [[ -n $CA && -f $CA ]]; then
    CA_ARGS=(-v "$CA:/etc/fiberexec-ca.pem:ro" -e PIP_CERT=/etc/fiberexec-ca.pem
             -e SSL_CERT_FILE=/etc/fiberexec-ca.pem)
fi

SCRIPT='set -eu
test -f /usr/lib/python3.11/EXTERNALLY-MANAGED || { echo "not a PEP 668 python3"; exit 3; }
echo "+ python3 $(python3 -c "import sys; print(sys.version.split()[0])") at $(command -v python3) (PEP 668: externally managed)"
mkdir /home/user && cd /home/user && tar -xf /src.tar
echo "+ $INSTALL"; bash -euo pipefail -c "$INSTALL"
echo "+ $TEST -e lint"; bash -euo pipefail -c "$TEST -e lint"'

log "running the README's quick start in $BASE (Debian 12, its own python3)"
started=$SECONDS
if ! timeout "$LIMIT" docker run --name "$NAME" --rm --network host \
        -v "$WORK/src.tar:/src.tar:ro" "${ENV_ARGS[@]}" "${CA_ARGS[@]}" \
        -e INSTALL="$INSTALL" -e TEST="$TEST" "$BASE" bash -c "$SCRIPT" >"$WORK/out.log" 2>&1; then
    tail -n 60 "$WORK/out.log" >&2
    die "the README's quick start failed in a fresh Debian 12 container (output above)"
fi
grep -E '^\+ |pi ~|tasks/s|lint: OK|congratulations' "$WORK/out.log" >&2 || true
grep -q 'congratulations' "$WORK/out.log" || { tail -n 40 "$WORK/out.log" >&2; die "tox did not report success"; }
log "both commands passed in $((SECONDS - started))s"
