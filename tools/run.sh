#!/usr/bin/env bash
# The README's quick start: `bash tools/run.sh train` runs the main job, `bash tools/run.sh test` the test suite.
# Both set up what they need first (tools/bootstrap.sh, idempotent). Extra arguments go to the command.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CENTROID_VENV:-$ROOT/.venv}"
cmd="${1:-}"
shift || true
case "$cmd" in
    train | test) ;;
    *) echo "usage: bash tools/run.sh train|test [args...]" >&2; exit 2 ;;
esac
# The main job does not wait for the torch-cluster compile (an optional backend, built by `test`); it uses it once built.
if [ "$cmd" = train ]; then
    CENTROID_CLUSTER="${CENTROID_CLUSTER:-0}" bash "$ROOT/tools/bootstrap.sh"
else
    bash "$ROOT/tools/bootstrap.sh"
fi
cd "$ROOT"
[ "$cmd" = train ] && exec "$VENV/bin/python" tools/train_modelnet.py "$@"

# Inductor's compiled graphs kept beside the wheels, outside the clone: a later run (another clone, the torch 2.11
# virtualenv) reuses the kernels of every graph it compiled before (keyed by graph and torch version), so the compile
# tests pay for code generation once per change, not once per run.
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/centroid-toolkit/inductor}"

# The fast suite plus the slow tests (what CI runs); `dataset` tests need full datasets and are left out. The ten
# slowest tests close each report, so that a test that grows is seen; each file's seconds go to runs/test-durations.json
# (tests/durations.json is a copy: the order in which the files are handed to the cores, longest first).
mkdir -p runs
rm -f runs/test-durations.json
PYTEST=("$VENV/bin/python" -m pytest -m "not dataset" --durations=10 --durations-out=runs/test-durations.json)
cores="$(nproc)"
workers="${CENTROID_TEST_WORKERS:-$((cores < 8 ? cores : 8))}"
[ "$workers" -gt 1 ] || exec "${PYTEST[@]}" "$@"

# On every core (pytest-xdist; a file's tests stay on one worker, so that its module fixtures run once; cores / workers
# intra-op threads a worker; the files in the order tests/conftest.py gives them, longest first), then the tests
# marked serial alone, with every core.
rc=0
OMP_NUM_THREADS="${OMP_NUM_THREADS:-$((cores > workers ? cores / workers : 1))}" \
    "${PYTEST[@]}" -n "$workers" --dist loadfile --no-loadscope-reorder --serial=exclude "$@" || rc=$?
rc_serial=0
"${PYTEST[@]}" --serial=only "$@" || rc_serial=$?
# pytest's 5 (no test collected) stands only when neither pass collected one
if [ "$rc" -eq 5 ] && [ "$rc_serial" -eq 5 ]; then
    exit 5
fi
[ "$rc" -eq 5 ] && rc=0
[ "$rc_serial" -eq 5 ] && rc_serial=0
exit $((rc != 0 ? rc : rc_serial))
