#!/usr/bin/env bash
# Builds a torch-cluster wheel against the torch of $PYTHON (default python3), its ops compiled side by side.
#
#   bash tools/build_torch_cluster_wheel.sh SDIST OUT_DIR            # CUDA if torch sees a GPU, else CPU only
#   TORCH_CUDA_ARCH_LIST=9.0 bash tools/build_torch_cluster_wheel.sh SDIST OUT_DIR   # CUDA for these archs
#
# torch-cluster is source-only on the registry, and its setup.py compiles its nine ops one after another without
# ninja (MAX_JOBS does nothing), twice with CUDA (a CPU and a CUDA variant of each), which takes a long time. This
# builds only the CUDA variants (which contain the CPU code too; torch_cluster loads either),
# each op in its own process, JOBS at a time (default nproc), into the build folder where bdist_wheel then finds them
# up to date. Not `build_ext -j`: without ninja, torch's BuildExtension swaps the shared compiler command for nvcc
# while it compiles a .cu file, which other threads would see. Install the wheel with pip, or hand it to
# tools/gpu_check.py --wheels on a machine without a registry (docs/gpu.md). SDIST is torch_cluster-<version>.tar.gz:
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

# setup.py builds every op in csrc/; with TORCH_CLUSTER_ONLY=<op> it builds that one
"$py" -c "
from pathlib import Path
p = Path('setup.py')
s = p.read_text()
anchor = \"    main_files = [path for path in main_files if 'hip' not in path]\n\"
assert anchor in s, 'setup.py changed: cannot restrict the build to one op'
only = (\"    if os.getenv('TORCH_CLUSTER_ONLY'):\n\"
        \"        main_files = [p for p in main_files if osp.basename(p)[:-4] == os.getenv('TORCH_CLUSTER_ONLY')]\n\")
p.write_text(s.replace(anchor, anchor + only))
"
# the folder bdist_wheel's build_ext writes to (setuptools: build/lib.<platform>-<cache tag>)
build_lib=build/$("$py" -c "import sys, sysconfig; print(f'lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}')")
mkdir -p build
ops=$(for f in csrc/*.cpp; do basename "$f" .cpp; done | grep -v hip)
start=$(date +%s)
export py build_lib
# shellcheck disable=SC2016  # expanded by the inner sh, per op
if ! printf '%s\n' $ops | xargs -P "${JOBS:-$(nproc)}" -I{} sh -c '
        TORCH_CLUSTER_ONLY={} "$py" setup.py -q build_ext -b "$build_lib" -t build/temp_{} > build/{}.log 2>&1 ||
        { echo "[torch-cluster] op {} failed:" >&2; tail -30 build/{}.log >&2; exit 1; }'; then
    exit 1
fi
echo "[torch-cluster] $(echo $ops | wc -w) ops compiled in $(( $(date +%s) - start )) s" >&2
"$py" setup.py -q bdist_wheel -d "$out" >&2  # every extension is up to date in $build_lib: nothing recompiles
echo "[torch-cluster] built in $(( $(date +%s) - start )) s: $(ls "$out"/torch_cluster-*.whl)" >&2
