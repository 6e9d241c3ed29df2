#!/usr/bin/env bash
# CI (optional step): the Ray launcher for real. Creates the separate environment the README
# describes (`pip install 'transformer_lab[ray]'` in an environment of its own: hydra-ray-launcher
# pins cloudpickle<3), then runs tests/test_ray_launcher.py, a 2-job sweep through
# hydra/launcher=ray on a local Ray cluster. Prints the time of each phase.
#   bash .ci/ray_sweep.sh            (RAY_VENV=DIR to put the environment elsewhere)
# An install that fails (the package registry) is reported and skips the test; a failing sweep
# test fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
RAY_VENV=${RAY_VENV:-.ray-venv}
PYTHON=${PYTHON:-python3}
start=$(date +%s)
if [ ! -x "$RAY_VENV/bin/python" ]; then
  "$PYTHON" -m venv "$RAY_VENV"
fi
if ! "$RAY_VENV/bin/pip" install --quiet -c constraints.txt -e ".[ray,dev]"; then
  echo "ray: the environment could not be installed; the Ray sweep test did not run"
  exit 0
fi
"$RAY_VENV/bin/pip" check || echo "pip check reported the conflicts above (ray venv)"
installed=$(date +%s)
echo "ray venv ready in $((installed - start)) s"
"$RAY_VENV/bin/python" -m pytest -p no:cacheprovider -q -m ray tests/test_ray_launcher.py -rs
echo "ray sweep test in $(( $(date +%s) - installed )) s (total $(( $(date +%s) - start )) s)"
