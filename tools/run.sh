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
case "$cmd" in
    train) exec "$VENV/bin/python" tools/train_modelnet.py "$@" ;;
    # The fast suite plus the slow tests (what CI runs); `dataset` tests need full datasets and are left out.
    # The ten slowest tests close the report, so that a test that grows is seen.
    test) exec "$VENV/bin/python" -m pytest -m "not dataset" --durations=10 "$@" ;;
esac
