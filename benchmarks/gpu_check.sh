#!/usr/bin/env bash
# Everything tlab checks on a GPU machine, in one go (a lent GPU is rare and its time short):
#   the CUDA tests, the training-step benchmark (fp32 and bf16), `tlab validate` and
#   `tlab smoke --seeds 4` on the GPU, then the whole test suite.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh   # CSVs, logs and run folders: $OUT/gpu_check.tgz
#
# Run from the repository root with a Python that has torch (CUDA build) and tlab's
# dependencies importable. If ./.whl holds wheels (hydra-core, omegaconf, antlr4, x-transformers
# and theirs), they are installed into /tmp/site first (for a machine without a registry).
# Each part has its own time limit, so one that hangs does not cost the others. A dry run of
# the script itself on a CPU: DEVICE=cpu CAP=20 (every part stopped after 20 s). Some parts
# only: ONLY="cuda_tests bench_fp32".
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_check_out}
DEVICE=${DEVICE:-cuda}
CAP=${CAP:-600}
FAILED=""
WORK=$(mktemp -d)  # everything is written here, then packed into one file in $OUT
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
# The subprocess tests call the `tlab` script beside the interpreter.
BIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
if [ ! -x "$BIN/tlab" ]; then
    printf '#!/bin/sh\nexec %s -m transformer_lab "$@"\n' "$BIN/python3" > "$BIN/tlab"
    chmod +x "$BIN/tlab"
fi

part() {  # part NAME SECONDS COMMAND...: run, time, keep the log
    local name=$1 limit=$(( $2 < CAP ? $2 : CAP )); shift 2
    [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0
    echo "=== $name"
    local start=$(date +%s%N)
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$WORK/$name.log"
    [ "$rc" -eq 0 ] || FAILED="$FAILED $name"
    echo "=== $name: exit $rc, $(( ($(date +%s%N) - start) / 1000000 )) ms"
    tar czf "$OUT/gpu_check.tgz" -C "$WORK" .  # after every part: kept if a later one is cut
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.is_available() and torch.cuda.get_device_name(0))"
part cuda_tests 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
    tests/test_trainer.py
part bench_fp32 120 python3 -m benchmarks.run --device "$DEVICE" --steps-scale 5 \
    --out "$WORK/results_cuda.csv"
part bench_bf16 90 python3 -m benchmarks.run --device "$DEVICE" --precision bf16 --steps-scale 5 \
    --sizes small,medium --out "$WORK/results_cuda_bf16.csv"
part validate 90 python3 -m transformer_lab validate "train.device=$DEVICE" \
    "hydra.run.dir=$WORK/validate_run"
part smoke_seeds 60 python3 -m transformer_lab smoke --seeds 4 "train.device=$DEVICE" \
    "hydra.run.dir=$WORK/smoke_seeds_run"
# pytest-xdist, where installed, spreads the suite over 8 processes
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
part full_suite 150 python3 -m pytest -q -p no:cacheprovider -x $XDIST tests
echo "failed parts:${FAILED:- none}"
[ -z "$FAILED" ]
