"""Checkpoints (issues 25, 30): every trained model's final weights as safetensors with the
config that rebuilds it; ``tlab train`` keeps its resumable state by default (at the end, on
SIGINT/SIGTERM, and every ``train.checkpoint_every`` steps); ``--resume RUN_DIR`` goes on with
an interrupted ``tlab train`` run (killed with SIGKILL, SIGINT or SIGTERM in a process of its
own) and its files equal those of a run never stopped, timings aside; ``--resume RUN_DIR
train.steps=N`` trains a finished run on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import assert_refused, default_ctrl_c, read_csv

from transformer_lab.config.instantiate import build_task
from transformer_lab.results.run_directory import CHECKPOINT_FILE, CLAIM_FILE, WEIGHTS_FILE
from transformer_lab.training.checkpoint import load_state, load_trained, read_header, run_weights
from transformer_lab.training.schedules import warmup_cosine
from transformer_lab.training.trainer import evaluate_model

# A 64-token synthetic language (offline) on the tiny model: a fraction of a second per seed.
TINY_LM = ["experiment=train", "task=lm", "model=tiny", "task.eval_size=32",
           "train.batch_size=8", "train.lr=1e-2", "train.steps=40", "train.eval_every=20",
           "train.log_every=5", "train.warmup=5", "train.device=cpu", "logger.progress=false"]
TIMING = ("tokens_per_s", "elapsed_s", "wall_s", "step_ms", "steady_tokens_per_s", "mfu",
          "peak_flop_per_s")
STOP_SCRIPT = Path(__file__).with_name("stop_at_step.py")


def held_out_loss(path: Path) -> float:
    """The held-out loss of the model a weights file rebuilds, on its own config's task."""
    trained = load_trained(path)
    task = build_task(trained.spec)
    return evaluate_model(trained.model, task, task.eval_batch())["loss"]


def without_timings(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def test_train_keeps_weights_that_rebuild_each_seeds_model(tlab, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert tlab(*TINY_LM, f"hydra.run.dir={one}")[0] == 0
    assert tlab(*TINY_LM, "routine.seeds=2", f"hydra.run.dir={two}")[0] == 0
    assert (one / WEIGHTS_FILE).is_file() and not (one / "models").exists()
    # by default the final resumable state too: the seed's trainer state at its last step
    state = load_state(one / CHECKPOINT_FILE)
    (seed,) = state["done"]
    assert state["current"] is None and seed["trainer"]["step"] == seed["result"]["steps"] == 40
    assert state["metric_rows"] == len(read_csv(one / "metrics.csv"))
    assert set(seed["trainer"]) >= {"model", "optimizers", "torch_rng", "data_rng", "horizon"}
    (summary,) = read_csv(one / "summary.csv")
    # the rebuilt model's held-out loss is the run's final one (fp32 rounding of one forward)
    assert held_out_loss(one / WEIGHTS_FILE) == pytest.approx(float(summary["final_loss"]),
                                                              rel=1e-5)
    files = [h.path for h in run_weights(two)]
    assert files == [two / "models" / "seed0.safetensors", two / "models" / "seed1.safetensors"]
    for row, path in zip(read_csv(two / "seeds.csv"), files, strict=True):
        header = read_header(path)
        assert (header.seed, header.variant, header.spec.seed) == (int(row["seed"]), None,
                                                                  int(row["seed"]))
        assert held_out_loss(path) == pytest.approx(float(row["final_loss"]), rel=1e-5)
    # seed 0 of a two-seed run is the one-seed run's model, tensor for tensor
    a, b = load_trained(one / WEIGHTS_FILE).model, load_trained(files[0]).model
    for name, tensor in a.state_dict().items():
        assert torch.equal(tensor, b.state_dict()[name]), name


def test_compare_keeps_each_variant_and_seed_with_its_config(tlab, tmp_path):
    out = tmp_path / "cmp"
    code, _, err = tlab("experiment=compare", "routine.vary.key=pe",
                        "routine.vary.values=[rope,alibi]", "routine.seeds=2",
                        "routine.steps=6", *(a for a in TINY_LM[1:] if a != "train.steps=40"),
                        f"hydra.run.dir={out}")  # (compare's length is routine.steps)
    assert code == 0, err
    headers = run_weights(out)
    assert [(h.variant, h.seed) for h in headers] == [("rope", 0), ("rope", 1), ("alibi", 0),
                                                      ("alibi", 1)]
    runs = {(r["variant"], r["seed"]): r for r in read_csv(out / "compare_runs.csv")}
    for header in headers:
        assert header.path == out / "models" / header.variant / f"seed{header.seed}.safetensors"
        assert header.spec.model.pe.name == header.variant and header.varied == "pe"
        loss = float(runs[(header.variant, str(header.seed))]["final_loss"])  # full precision
        assert held_out_loss(header.path) == pytest.approx(loss, rel=1e-6)


def test_a_text_runs_weights_carry_its_tokenizer(tlab, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40, encoding="utf-8")
    out = tmp_path / "run"
    code, _, err = tlab(*TINY_LM, "task=text", f"task.path={text}", "task.seq_len=16",
                        f"hydra.run.dir={out}")
    assert code == 0, err
    text.unlink()  # the weights file is enough
    trained = load_trained(out / WEIGHTS_FILE)
    assert trained.tokenizer.decode(trained.tokenizer.encode("that is")) == "that is"
    assert trained.tokenizer.vocab_size == trained.model.token_embedding.num_embeddings


def stopped_run(out: Path, signal_name: str, stop_at: int, stop_fit: int, *args: str) -> int:
    """Run ``args`` in a process of its own, stopped by ``signal_name`` before step
    ``stop_at`` of its ``stop_fit``-th training; returns its exit code."""
    env = {**os.environ, "STOP_AT": str(stop_at), "STOP_FIT": str(stop_fit),
           "STOP_SIGNAL": signal_name}
    done = subprocess.run([sys.executable, str(STOP_SCRIPT), *args, f"hydra.run.dir={out}"],
                          preexec_fn=default_ctrl_c,
                          env=env, capture_output=True, text=True, timeout=300)
    return done.returncode


@pytest.mark.parametrize(("signal_name", "stop_at", "stop_fit", "code", "every"), [
    ("SIGKILL", 27, 2, -9, 7),  # no cleanup at all, in the second seed, 6 steps after a checkpoint
    ("SIGINT", 33, 1, 130, 7),  # Ctrl-C in the first seed: status interrupted, exit 130
    ("SIGTERM", 13, 2, 143, 0),  # SLURM / timeout, default settings: state kept, exit 143
])
def test_resume_after_a_kill_equals_a_run_never_stopped(tlab, tmp_path, signal_name, stop_at,
                                                        stop_fit, code, every):
    args = [*TINY_LM, "routine.seeds=2", f"train.checkpoint_every={every}"]
    full, stopped = tmp_path / "full", tmp_path / "stopped"
    assert tlab(*args, f"hydra.run.dir={full}")[0] == 0
    assert stopped_run(stopped, signal_name, stop_at, stop_fit, *args) == code
    state = load_state(stopped / CHECKPOINT_FILE)
    # SIGKILL: the last multiple of 7 before the stop; SIGINT/SIGTERM: the end of the step the
    # signal came in (step stop_at), its rows included
    stopped_step = 21 if signal_name == "SIGKILL" else stop_at
    assert (len(state["done"]), state["current"]["trainer"]["step"]) == (stop_fit - 1,
                                                                        stopped_step)
    rows_before = len(read_csv(stopped / "metrics.csv"))
    if signal_name == "SIGKILL":
        assert rows_before > state["metric_rows"]  # rows after the checkpoint: dropped on resume
    else:
        assert rows_before == state["metric_rows"]
        info = json.loads((stopped / "run.json").read_text())
        assert (info["status"], info["exit_code"]) == ("interrupted", code)
        assert f"interrupted at step {stop_at} of 40 of seed {stop_fit - 1}" in info["error"]
        assert f"tlab train --resume {stopped}" in info["error"]

    code, _, err = tlab("experiment=train", "--resume", stopped)
    assert code == 0, err
    for name in ("metrics", "summary", "seeds"):
        assert without_timings(read_csv(stopped / f"{name}.csv")) == \
            without_timings(read_csv(full / f"{name}.csv")), name
    for seed in (0, 1):
        a = load_trained(full / "models" / f"seed{seed}.safetensors").model.state_dict()
        b = load_trained(stopped / "models" / f"seed{seed}.safetensors").model.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), seed
    finished = load_state(stopped / CHECKPOINT_FILE)  # the final state, to train further
    assert finished["current"] is None and [d["seed"] for d in finished["done"]] == [0, 1]
    info = json.loads((stopped / "run.json").read_text())
    assert info["status"] == "passed" and len(info["resumes"]) == 1
    assert info["resumes"][0]["previous_status"] == \
        ("running" if signal_name == "SIGKILL" else "interrupted")
    assert not list(stopped.glob(".*.part")) and not list(stopped.glob(f"{CLAIM_FILE}.*"))


def test_resume_refuses_a_run_it_cannot_go_on_with(tlab, tmp_path):
    plain, finished = tmp_path / "plain", tmp_path / "finished"
    assert tlab(*TINY_LM, "train.checkpoint=false", f"hydra.run.dir={plain}")[0] == 0
    assert not (plain / CHECKPOINT_FILE).exists()
    err = assert_refused(tlab("experiment=train", "--resume", plain), tmp_path / "none",
                         "has no checkpoint to go on from (it finished: status passed)",
                         "every N steps with train.checkpoint_every=N")
    assert len(err.strip().splitlines()) <= 2
    # the same directory as --out again: refused, naming --resume where it can go on
    assert_refused(tlab(*TINY_LM, f"hydra.run.dir={plain}"), tmp_path / "none",
                   "already holds a run")
    assert "--resume" not in tlab(*TINY_LM, f"hydra.run.dir={plain}")[2]
    stopped = tmp_path / "stopped"
    args = [*TINY_LM, "train.checkpoint_every=10"]
    assert stopped_run(stopped, "SIGKILL", 25, 1, *args) == -9
    assert_refused(tlab("experiment=train", "train.lr=0.5", "--resume", stopped),
                   tmp_path / "none", "train.lr=0.5 is not part of the run recorded there")
    assert_refused(tlab("experiment=train", "--resume", stopped, f"hydra.run.dir={finished}"),
                   tmp_path / "none", "already names the run directory")
    # the config files changed since the checkpoint: the run cannot go on with the same numbers
    recorded = stopped / ".hydra" / "overrides.yaml"
    original = recorded.read_text()
    recorded.write_text(original.replace("train.lr=1e-2", "train.lr=2e-2"))
    assert_refused(tlab("experiment=train", "--resume", stopped), tmp_path / "none",
                   "train.lr is 0.02 now but was 0.01 when the run was checkpointed")
    recorded.write_text(original)
    # still being run by a live process on this host: refused, its claim untouched
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        claim = stopped / CLAIM_FILE
        owner = json.loads(claim.read_text())
        claim.write_text(json.dumps({**owner, "pid": sleeper.pid}))
        assert_refused(tlab("experiment=train", "--resume", stopped), tmp_path / "none",
                       "is still being run: pid")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert tlab("experiment=train", "--resume", stopped)[0] == 0  # its owner gone: goes on
    assert json.loads((stopped / "run.json").read_text())["status"] == "passed"


def test_a_finished_run_trains_on_to_more_steps(tlab, tmp_path):
    """``--resume RUN train.steps=20`` after a 10-step run: with a schedule that does not depend
    on the length (constant after warm-up) the model is the one a 20-step run trains, tensor for
    tensor, and its rows are that run's plus the 10-step run's last held-out row."""
    args = [*TINY_LM, "train.eval_every=0", "train.steps=10", "train.schedule=constant"]
    short, straight = tmp_path / "short", tmp_path / "straight"
    assert tlab(*args, f"hydra.run.dir={short}")[0] == 0
    assert tlab(*args, "train.steps=20", f"hydra.run.dir={straight}")[0] == 0
    # as the same directory given again, a finished run names --resume; without more steps,
    # or with as many or fewer, --resume is refused, naming the steps it has taken
    assert_refused(tlab(*args, f"hydra.run.dir={short}"), tmp_path / "none",
                   "already holds a run", f"tlab train --resume {short}")
    assert_refused(tlab("experiment=train", "--resume", short), tmp_path / "none",
                   "finished its 10 steps (status passed)",
                   f"tlab train --resume {short} train.steps=20")
    for steps in ("10", "7", "ten"):
        assert_refused(tlab("experiment=train", "--resume", short, f"train.steps={steps}"),
                       tmp_path / "none", "has taken 10 steps; give train.steps=N with N > 10")

    code, _, err = tlab("experiment=train", "--resume", short, "train.steps=20")
    assert code == 0, err
    a = load_trained(short / WEIGHTS_FILE).model.state_dict()
    b = load_trained(straight / WEIGHTS_FILE).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = without_timings(read_csv(short / "metrics.csv"))
    extra = [r for r in rows if (r["step"], r["split"]) == ("10", "val")]
    assert len(extra) == 1  # the 10-step run's final evaluation
    assert [r for r in rows if r is not extra[0]] == without_timings(
        read_csv(straight / "metrics.csv"))
    (summary,) = read_csv(short / "summary.csv")
    assert summary["steps"] == "20" and summary["status"] == "passed"
    assert summary["final_loss"] == read_csv(straight / "summary.csv")[0]["final_loss"]
    assert "train.steps=20" in (short / ".hydra" / "overrides.yaml").read_text()
    assert load_state(short / CHECKPOINT_FILE)["done"][0]["trainer"]["step"] == 20


def test_an_extended_runs_schedule_is_that_of_a_run_of_the_new_length(tlab, tmp_path):
    """warmup_cosine: the 10 steps taken follow the 10-step schedule, the steps after the
    extension that of a 20-step run (README, Keep, resume)."""
    run = tmp_path / "run"
    assert tlab(*TINY_LM, "train.schedule=warmup_cosine", "train.steps=10", "train.log_every=1",
                "train.eval_every=0", f"hydra.run.dir={run}")[0] == 0
    assert tlab("experiment=train", "--resume", run, "train.steps=20")[0] == 0
    settings = SimpleNamespace(lr=1e-2, warmup=5, min_lr_ratio=0.1)  # TINY_LM's, the default floor
    rows = [r for r in read_csv(run / "metrics.csv") if r["split"] == "train"]
    assert [int(r["step"]) for r in rows] == list(range(1, 21))
    for row in rows:
        step = int(row["step"])
        expected = warmup_cosine(step, settings, 10 if step <= 10 else 20)
        assert float(row["lr"]) == pytest.approx(expected, rel=1e-5), step  # CSV: 6 digits
