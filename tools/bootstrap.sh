#!/usr/bin/env bash
# Sets up everything the toolkit needs, idempotently: Debian libraries for open3d (when run as root), a virtualenv
# in .venv (override with CENTROID_VENV), the package with its extras at the exact versions of constraints.txt, and
# torch-cluster compiled against that torch (slow the first time on a machine: it compiles C++ into a wheel that
# tools/install_torch_cluster.sh keeps outside the clone, per torch and Python, for every later clone).
# A second run with nothing changed returns at once.
#
# Switches (environment variables; the defaults give the README's environment):
#   CENTROID_VENV         the virtualenv (default .venv)
#   CENTROID_CONSTRAINTS  the exact versions (default constraints.txt); torch-cluster is built only when this file
#                         pins it, e.g. constraints-torch211.txt (the oldest supported torch) leaves it out, and
#                         easypytorch3d (pytorch3d's prebuilt wheel, which loads with torch 2.11 and 2.12 only) is
#                         installed only when it pins it: constraints-torch211.txt does, constraints.txt does not
#   CENTROID_EXTRAS       the package's extras (default dev,viz,docs; `dev` alone leaves out open3d and the docs tools)
#   CENTROID_PYTHON       the interpreter that creates the virtualenv (default python3)
#   CENTROID_CLUSTER      1 (default) builds torch-cluster where the constraints pin it; 0 leaves the build for later
#                         (`bash tools/run.sh train` passes 0: the main job runs on the torch paths without it)
#   CENTROID_WHEEL_CACHE  where the torch-cluster wheels are kept
#                         (default ${XDG_CACHE_HOME:-~/.cache}/centroid-toolkit/wheels)
#   CENTROID_INSTALLER    uv (default) or pip. uv keeps every wheel unpacked in its cache (~/.cache/uv, or
#                         UV_CACHE_DIR) and links the files into each new virtualenv, so a second clone or the torch
#                         2.11 virtualenv does not unpack ~6 GB again as pip does; without uv (it is installed into
#                         the virtualenv from the package index) pip installs the same versions
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CENTROID_VENV:-$ROOT/.venv}"
PY="${CENTROID_PYTHON:-python3}"
CONSTRAINTS="${CENTROID_CONSTRAINTS:-$ROOT/constraints.txt}"
case "$CONSTRAINTS" in /*) ;; *) CONSTRAINTS="$ROOT/$CONSTRAINTS" ;; esac
EXTRAS="${CENTROID_EXTRAS:-dev,viz,docs}"
CLUSTER="${CENTROID_CLUSTER:-1}"
INSTALLER="${CENTROID_INSTALLER:-uv}"
STAMP="$VENV/.centroid-bootstrap"
APT_PACKAGES=(libusb-1.0-0 libgl1 libegl1 libgomp1 libvulkan1 mesa-vulkan-drivers xvfb xauth)

say() { printf '[bootstrap] %s\n' "$*" >&2; }

install_debian_libs() {
    command -v dpkg-query >/dev/null 2>&1 || { say "not a Debian system: skipping ${APT_PACKAGES[*]}"; return 0; }
    local missing=()
    for pkg in "${APT_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "not root: cannot install ${missing[*]} (open3d needs them; its tests will skip)"
        return 0
    fi
    say "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# What the install depends on: the packaging files and the set of top-level packages (the editable install maps
# each package by name, so a new package needs a reinstall). Computed before installing, stored after success.
fingerprint() {
    { cat "$ROOT/pyproject.toml" "$CONSTRAINTS" "$ROOT/tools/bootstrap.sh" "$ROOT/tools/install_torch_cluster.sh"
      echo "extras=$EXTRAS"; ls -d "$ROOT"/*/__init__.py; } |
        sha256sum | cut -d' ' -f1
}

[ -f "$CONSTRAINTS" ] || { say "constraints file $CONSTRAINTS not found (CENTROID_CONSTRAINTS)"; exit 1; }
install_debian_libs

# The stamp is the fingerprint plus whether torch-cluster was built: a set-up with it serves a call that skips it.
WANT="$(fingerprint)"
if [ -f "$STAMP" ] && [ -x "$VENV/bin/python" ]; then
    case "$(cat "$STAMP")" in
        "$WANT cluster=1") exit 0 ;;
        "$WANT cluster=0") [ "$CLUSTER" = 0 ] && exit 0 ;;
    esac
fi

# A half-made virtualenv (e.g. `venv` without ensurepip) has bin/python but no pip: start it again.
if [ -x "$VENV/bin/python" ] && ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    say "virtualenv $VENV has no working pip: recreating it"
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV with $("$PY" --version 2>&1)"
    if ! "$PY" -m venv "$VENV" || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        rm -rf "$VENV"
        say "could not create a virtualenv with pip using $PY; on Debian install python3-venv (or set CENTROID_PYTHON)"
        exit 1
    fi
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip setuptools wheel

case "$INSTALLER" in
    uv)
        if ! "$VENV/bin/uv" --version >/dev/null 2>&1 && ! "${PIP[@]}" install -q -c "$CONSTRAINTS" uv; then
            say "could not install uv: installing with pip instead"
            INSTALLER=pip
        fi ;;
    pip) ;;
    *) say "CENTROID_INSTALLER must be uv or pip, got '$INSTALLER'"; exit 2 ;;
esac
say "installing centroid-toolkit[$EXTRAS] with $(basename "$CONSTRAINTS") by $INSTALLER (torch is ~5.6 GB the first time)"
if [ "$INSTALLER" = uv ]; then
    # compiled to bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, every process would recompile torch
    "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python" -c "$CONSTRAINTS" -e "$ROOT[$EXTRAS]"
else
    "${PIP[@]}" install -q -c "$CONSTRAINTS" -e "$ROOT[$EXTRAS]"
fi

BUILT_CLUSTER=1
if [ "$CLUSTER" = 0 ] && ! "$VENV/bin/python" -c "import torch_cluster" >/dev/null 2>&1; then
    say "not building torch-cluster now (CENTROID_CLUSTER=0); \`bash tools/run.sh test\` builds it"
    BUILT_CLUSTER=0
elif grep -qiE '^torch[-_]cluster==' "$CONSTRAINTS"; then
    if ! "$VENV/bin/python" -c "import torch_cluster" >/dev/null 2>&1; then
        bash "$ROOT/tools/install_torch_cluster.sh" "$VENV" "$CONSTRAINTS"
    fi
    "$VENV/bin/python" -c "import torch_cluster" >&2
else
    say "$(basename "$CONSTRAINTS") pins no torch-cluster: not building it (the torch fast paths are used)"
fi
# pytorch3d: easypytorch3d's prebuilt wheel (CPython 3.11, Linux x86-64) is compiled against torch 2.11 / 2.12 and fails
# to load with later releases (an undefined symbol), so it is installed only where the constraints pin it and kept only
# if its extension loads with this torch; without a wheel for this Python the pytorch3d backends stay off.
if grep -qiE '^easypytorch3d==' "$CONSTRAINTS" && ! "$VENV/bin/python" -c "import pytorch3d._C" >/dev/null 2>&1; then
    say "installing easypytorch3d (pytorch3d's prebuilt wheel) with $(basename "$CONSTRAINTS")"
    if [ "$INSTALLER" = uv ]; then
        PIP_INSTALL=("$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python")
    else
        PIP_INSTALL=("${PIP[@]}" install -q)
    fi
    if ! "${PIP_INSTALL[@]}" -c "$CONSTRAINTS" easypytorch3d; then
        say "could not install easypytorch3d (wheels for CPython 3.11 on Linux x86-64 only; this is" \
            "$("$VENV/bin/python" --version 2>&1)): the pytorch3d backends stay off"
    elif ! "$VENV/bin/python" -c "import pytorch3d._C"; then
        say "pytorch3d's extension does not load with this torch (above): removing easypytorch3d"
        "${PIP[@]}" uninstall -q -y easypytorch3d
    fi
fi
"$VENV/bin/python" -c "import torch, timm, torchvision; print('[bootstrap] torch', torch.__version__, 'torchvision', torchvision.__version__, 'timm', timm.__version__)" >&2

echo "$WANT cluster=$BUILT_CLUSTER" >"$STAMP"
