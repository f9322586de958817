#!/usr/bin/env bash
# Builds a torch-cluster wheel against the torch of $PYTHON (default python3), its extensions compiled in parallel.
#
#   bash tools/build_torch_cluster_wheel.sh SDIST OUT_DIR            # CUDA if torch sees a GPU, else CPU only
#   TORCH_CUDA_ARCH_LIST=9.0 bash tools/build_torch_cluster_wheel.sh SDIST OUT_DIR   # CUDA for these archs
#
# torch-cluster is source-only on the registry, and its setup.py compiles its nine ops one after another without
# ninja (MAX_JOBS does nothing), twice with CUDA (a CPU and a CUDA variant of each): 300 s on a 16-core GPU machine
# did not finish. This builds only the CUDA variants (which contain the CPU code too; torch_cluster loads either)
# and runs setuptools' build_ext with -j, so the ops compile side by side. The wheel then travels as a carried wheel
# (README, "Checking on a GPU"). SDIST is torch_cluster-<version>.tar.gz, fetched where a registry is reachable:
#   python3 -m pip download --no-deps --no-binary :all: torch-cluster==1.6.3 -d .whl/src
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: bash tools/build_torch_cluster_wheel.sh SDIST OUT_DIR" >&2
    exit 2
fi
sdist=$(realpath "$1")
mkdir -p "$2"
out=$(realpath "$2")
py=${PYTHON:-python3}
[[ "$py" == */* ]] && py=$(realpath -s "$py")  # absolute (a venv's link kept): survives the cd below
[ -f "$sdist" ] || { echo "no source archive at $sdist" >&2; exit 1; }
"$py" -c "import torch" || { echo "$py cannot import torch: build against which torch? (set PYTHON)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar xzf "$sdist" -C "$work"
cd "$work"/torch_cluster-*/

if [ -n "${TORCH_CUDA_ARCH_LIST:-}" ] || "$py" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    # the GPU's own architecture unless told (one arch compiles in a fraction of the time of torch's default list)
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$("$py" -c \
        "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
    export TORCH_CUDA_ARCH_LIST FORCE_ONLY_CUDA=1
    echo "[torch-cluster] CUDA build for arch $TORCH_CUDA_ARCH_LIST" >&2
else
    export FORCE_ONLY_CPU=1
    echo "[torch-cluster] CPU build (torch sees no GPU and no TORCH_CUDA_ARCH_LIST was given)" >&2
fi
start=$(date +%s)
"$py" setup.py -q build_ext -j "${JOBS:-$(nproc)}" bdist_wheel -d "$out" >&2
echo "[torch-cluster] built in $(( $(date +%s) - start )) s: $(ls "$out"/torch_cluster-*.whl)" >&2
