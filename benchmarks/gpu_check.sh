#!/usr/bin/env bash
# Everything tlab checks on a GPU machine, in one visit of at most BUDGET seconds (default 450,
# inside 8 minutes with the set-up), parts in order of value:
#   cuda_tests  tests/test_cuda.py, test_trainer.py, test_ddp.py, test_compile.py
#   bench_gpu   benchmarks.run on the GPU shapes (gpu384, gpt2small), bf16, every contender
#               compiled: ms/step, tlab's ratio to each, % of the measured bf16 matmul peak
#   train_char  tlab train of the 10.7M-parameter char model on Tiny Shakespeare (nanoGPT's
#               shakespeare-char shape: 6 layers, 6 heads, 384 wide, block 256, batch 64), bf16,
#               compiled: steady tokens/s, MFU, held-out loss
#   ddp2        the same on 2 GPUs (tlab train --nproc 2, 64 sequences per GPU) where 2 are lent
#   full_suite  the whole test suite in the time left (pytest-xdist where installed)
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh   # CSVs, logs and run folders: $OUT/gpu_check.tgz
#
# Each part runs under its own `timeout` (never past the budget). Tests run with -v -rf: every
# failing test's name is printed after its part and again in the closing summary, also when a
# part was cut short or the script is stopped. Run from the repository root with a Python that
# has torch (CUDA build) and tlab's dependencies; wheels in ./.whl (hydra-core, omegaconf,
# antlr4, x-transformers and theirs) are installed into /tmp/site first (no registry there).
# The corpus: TEXT=FILE (default shared/data/tinyshakespeare.txt, else tlab's download cache).
# Dry run on a CPU: DEVICE=cpu CAP=20 (every part stopped after 20 s). Some parts only:
# ONLY="cuda_tests train_char".
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-gpu_check_out}
DEVICE=${DEVICE:-cuda}
CAP=${CAP:-600}
BUDGET=${BUDGET:-450}
TEXT=${TEXT:-shared/data/tinyshakespeare.txt}
DEADLINE=$(( $(date +%s) + BUDGET ))
WORK=$(mktemp -d)  # everything is written here, then packed into one file in $OUT
SUMMARY="$WORK/summary.txt"
FAILED=""
mkdir -p "$OUT"
: > "$SUMMARY"
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

failing_tests() {  # the test ids a pytest log names as failed or in error (-v lines, -rf lines)
    grep -ohE '(FAILED|ERROR) tests/[^ ]+|tests/[^ ]+::[^ ]+ (FAILED|ERROR)' "$@" 2>/dev/null \
        | sed -E 's/^(FAILED|ERROR) //; s/ (FAILED|ERROR)$//' | sort -u
}

finish() {  # always: the parts' table, every failing test, the archive
    echo "=== summary (budget ${BUDGET}s)"
    cat "$SUMMARY"
    local failed
    failed=$(failing_tests "$WORK"/*.log)
    if [ -n "$failed" ]; then echo "failing tests:"; echo "$failed" | sed 's/^/  /'; fi
    tar czf "$OUT/gpu_check.tgz" -C "$WORK" . 2>/dev/null
}
trap finish EXIT

part() {  # part NAME SECONDS COMMAND...: run under timeout, keep the log, name failing tests
    local name=$1 limit=$(( $2 < CAP ? $2 : CAP )); shift 2
    [[ -z "${ONLY:-}" || " $ONLY " == *" $name "* ]] || return 0
    local left=$(( DEADLINE - $(date +%s) ))
    (( limit > left )) && limit=$left
    if (( limit < 10 )); then
        printf '%-11s skipped: the budget is spent\n' "$name" >> "$SUMMARY"; return 0
    fi
    echo "=== $name (at most ${limit}s)"
    local start=$(date +%s%N)
    timeout -k 5 "$limit" "$@" > "$WORK/$name.log" 2>&1
    local rc=$? ms=$(( ($(date +%s%N) - start) / 1000000 ))
    tail -n 30 "$WORK/$name.log"
    local note=""
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        note=" (cut short at ${limit}s)"
        local running  # a verbose pytest names a test before its result
        running=$(tail -n 1 "$WORK/$name.log" | grep -oE '^tests/[^ ]+::[^ ]+' | tail -n 1)
        [ -n "$running" ] && note="$note during $running"
    fi
    local failed
    failed=$(failing_tests "$WORK/$name.log")
    [ -n "$failed" ] && echo "failing tests in $name:" && echo "$failed" | sed 's/^/  /'
    printf '%-11s exit %3d  %6d ms%s\n' "$name" "$rc" "$ms" "$note" >> "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED="$FAILED $name"
    echo "=== $name: exit $rc, $ms ms$note"
}

train_numbers() {  # the run's summary.csv numbers worth a line
    python3 - "$1" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1] + "/summary.csv")))
keys = ("params", "steps", "final_loss", "steady_tokens_per_s", "step_ms", "mfu", "world_size",
        "device", "peak_source")
print("; ".join(f"{k}={rows[0].get(k)}" for k in keys))
EOF
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total \
    --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.is_available() and torch.cuda.get_device_name(0))"
GPUS=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)

PYTEST="python3 -m pytest -vv -rfE -p no:cacheprovider"  # -vv: a line per test (addopts has -q)
part cuda_tests 150 $PYTEST tests/test_cuda.py tests/test_trainer.py tests/test_ddp.py \
    tests/test_compile.py
part bench_gpu 150 python3 -m benchmarks.run --device "$DEVICE" --precision bf16 --compile \
    --sizes gpu384,gpt2small --rounds 5 --out "$WORK/results_cuda_bf16_compiled.csv"

[ -f "$TEXT" ] && CORPUS="task=text task.path=$(realpath "$TEXT")" || CORPUS="task=tinyshakespeare"
CHAR="$CORPUS model=small model.d_model=384 model.n_heads=6 model.n_layers=6 model.d_ff=1536
model.max_len=256 task.seq_len=256 pe=learned block=pre norm_layer=layernorm ffn=gelu
train.batch_size=64 train.steps=600 train.lr=1e-3 train.schedule=warmup_cosine train.warmup=60
train.eval_every=200 train.log_every=50 train.precision=bf16 train.compile=true
train.device=$DEVICE -q"
# shellcheck disable=SC2086
part train_char 110 python3 -m transformer_lab train $CHAR --out "$WORK/train_char"
[ -f "$WORK/train_char/summary.csv" ] && train_numbers "$WORK/train_char" | tee -a "$SUMMARY"
if [ "${GPUS:-0}" -ge 2 ]; then
    # shellcheck disable=SC2086
    part ddp2 90 python3 -m transformer_lab train --nproc 2 $CHAR train.grad_accum=2 \
        --out "$WORK/train_char_ddp2"
    [ -f "$WORK/train_char_ddp2/summary.csv" ] && train_numbers "$WORK/train_char_ddp2" \
        | tee -a "$SUMMARY"
else
    echo "ddp2        skipped: $GPUS GPU(s)" >> "$SUMMARY"
fi
XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8")
# shellcheck disable=SC2086
part full_suite 600 $PYTEST $XDIST tests
echo "failed parts:${FAILED:- none}" >> "$SUMMARY"
[ -z "$FAILED" ]
