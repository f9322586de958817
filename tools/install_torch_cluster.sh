#!/usr/bin/env bash
# Installs torch-cluster into a virtualenv from a wheel built once per machine for that virtualenv's torch and Python,
# kept outside the clone: another clone, or this one's virtualenv made again, installs it instead of compiling it
# (about 10 minutes on 2 cores). tools/bootstrap.sh calls it when the constraints pin torch-cluster.
#
#   bash tools/install_torch_cluster.sh VENV CONSTRAINTS   # install the torch-cluster CONSTRAINTS pins (building its
#                                                          # wheel if none is kept), its dependencies within CONSTRAINTS
#   bash tools/install_torch_cluster.sh --dir VENV         # print the wheel folder for VENV's torch and Python
#
# The folder is $CENTROID_WHEEL_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/centroid-toolkit/wheels) plus
# <python tag>-torch<torch version>, e.g. cp312-torch2.15.0; the extension links against that exact torch.
set -euo pipefail
shopt -s nullglob

say() { printf '[bootstrap] %s\n' "$*" >&2; }

wheel_dir() {
    local tag
    tag="$("$1/bin/python" -c 'import sys, torch; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}")')"
    printf '%s/%s\n' "${CENTROID_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/centroid-toolkit/wheels}" "$tag"
}

if [ "${1:-}" = --dir ] && [ $# -eq 2 ]; then
    wheel_dir "$2"
    exit 0
fi
if [ $# -ne 2 ] || [[ "$1" == -* ]]; then
    echo "usage: bash tools/install_torch_cluster.sh VENV CONSTRAINTS | --dir VENV" >&2
    exit 2
fi
VENV="$1"
CONSTRAINTS="$2"
VERSION="$(grep -iE '^torch[-_]cluster==' "$CONSTRAINTS" | head -n 1 | sed -E 's/^[^=]*==([^[:space:]#;]+).*/\1/')"
[ -n "$VERSION" ] || { say "$CONSTRAINTS pins no torch-cluster"; exit 1; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
DIR="$(wheel_dir "$VENV")"
pytag="${DIR##*/}"
pytag="${pytag%%-*}"

find_wheel() { compgen -G "$DIR/torch_cluster-$VERSION-$pytag-*.whl" | head -n 1 || true; }

wheel="$(find_wheel)"
if [ -z "$wheel" ]; then
    say "building torch-cluster $VERSION against the installed torch into $DIR (slow; once per torch and Python)"
    mkdir -p "$DIR"
    # Built in a scratch folder next to the cache and moved in whole, so that a killed build leaves no partial wheel.
    # No pip cache: pip keys its built wheels by the sdist, not by the torch they were compiled against.
    scratch="$(mktemp -d "$DIR/.build.XXXXXX")"
    trap 'rm -rf "$scratch"' EXIT
    MAX_JOBS="${MAX_JOBS:-$(nproc)}" "${PIP[@]}" wheel -q --no-cache-dir --no-build-isolation --no-deps \
        -w "$scratch" "torch-cluster==$VERSION"
    for built in "$scratch"/torch_cluster-*.whl; do
        mv "$built" "$DIR/"
    done
    wheel="$(find_wheel)"
    [ -n "$wheel" ] || { say "pip wheel left no torch_cluster-$VERSION-$pytag wheel in $DIR"; exit 1; }
else
    say "installing torch-cluster from $wheel (built before for this torch and Python)"
fi
"${PIP[@]}" install -q -c "$CONSTRAINTS" "$wheel"
