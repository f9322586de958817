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

# Builds the wheel into the kept folder: in a scratch folder next to it, moved in whole, so that a killed build leaves
# no partial wheel. Extra pip options: $@.
build() {
    local scratch built
    mkdir -p "$DIR"
    scratch="$(mktemp -d "$DIR/.build.XXXXXX")"
    MAX_JOBS="${MAX_JOBS:-$(nproc)}" "${PIP[@]}" wheel -q "$@" --no-build-isolation --no-deps \
        -w "$scratch" "torch-cluster==$VERSION" || { rm -rf "$scratch"; return 1; }
    for built in "$scratch"/torch_cluster-*.whl; do
        mv "$built" "$DIR/"
    done
    rm -rf "$scratch"
    wheel="$(find_wheel)"
    [ -n "$wheel" ] || { say "pip wheel left no torch_cluster-$VERSION-$pytag wheel in $DIR"; return 1; }
}

install() { "${PIP[@]}" install -q --force-reinstall --no-deps "$wheel" && "${PIP[@]}" install -q -c "$CONSTRAINTS" "$wheel"; }
imports() { "$VENV/bin/python" -c "import torch_cluster" >/dev/null 2>&1; }

wheel="$(find_wheel)"
if [ -n "$wheel" ]; then
    say "installing torch-cluster from $wheel (built before for this torch and Python)"
    install
    exit 0
fi
say "building torch-cluster $VERSION against the installed torch into $DIR (slow; once per torch and Python)"
# pip's own cache may hold a wheel it built before; pip keys it by the sdist, not by the torch it was compiled
# against, so it is kept only if it imports against this torch, else built again without the cache.
build
install
if ! imports; then
    say "the wheel from pip's cache does not import against this torch: building it again without the cache"
    rm -f "$wheel"
    build --no-cache-dir
    install
    imports || { say "torch-cluster $VERSION does not import after a fresh build"; exit 1; }
fi
