"""Data-parallel training (``training.distributed``, issue 31): ``tlab train --nproc 2`` (two
gloo processes on the CPU) gives the per-step numbers of one process at the same global batch;
``train.grad_accum=4`` at a quarter of the batch gives those of the whole batch; a killed DDP
run resumed goes on as one never stopped. Only rank 0 writes the run directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import read_csv

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.results.run_directory import CHECKPOINT_FILE, WEIGHTS_FILE
from transformer_lab.training.checkpoint import load_state, load_trained
from transformer_lab.training.trainer import Trainer

# The tiny model on the synthetic language (offline): 8 steps, a checkpoint every 3.
TINY = ["experiment=train", "task=lm", "model=tiny", "task.eval_size=32", "train.batch_size=8",
        "train.lr=1e-2", "train.steps=8", "train.eval_every=4", "train.log_every=1",
        "train.warmup=2", "train.checkpoint_every=3", "train.device=cpu",
        "logger.progress=false"]
TIMING = ("tokens_per_s", "elapsed_s", "wall_s", "step_ms", "steady_tokens_per_s", "mfu",
          "peak_flop_per_s")
STOP_SCRIPT = Path(__file__).with_name("stop_at_step.py")
# One fp32 forward and backward with the batch split differently (rows in other BLAS blocks,
# sums in another order) moves a loss by a few ulp; eight Adam steps carry that along.
REL = 1e-5


def losses(rows: list[dict[str, str]], split: str) -> list[float]:
    return [float(r["loss"]) for r in rows if r["split"] == split]


def without_timings(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def tlab_processes(*args: str | Path) -> subprocess.CompletedProcess:
    """``python -m transformer_lab ARGS`` in a process of its own (its ranks' output too)."""
    return subprocess.run([sys.executable, "-m", "transformer_lab", *map(str, args)],
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("task_overrides", [["task=lm"], ["task=reverse", "task.seq_len=6"]])
def test_grad_accum_at_a_quarter_batch_equals_the_whole_batch(task_overrides):
    """nanoGPT's convention: batch_size=2 grad_accum=4 trains on the same 8 sequences per step
    as batch_size=8 (reverse: a decoder scores only the target half of each sequence)."""
    def run(*overrides: str) -> tuple[list[float], list[float], Trainer]:
        spec = RunSpec.of(compose([*TINY, *task_overrides, *overrides]))
        task = build_task(spec)
        trainer = Trainer(build_model(spec.with_vocab(task.vocab_size).model, seed=0), task,
                          spec.train, 0)
        result = trainer.fit(8)
        return result.train_losses, result.grad_norms, trainer

    whole_losses, whole_norms, whole = run("train.batch_size=8")
    losses_, norms, accumulated = run("train.batch_size=2", "train.grad_accum=4")
    assert losses_ == pytest.approx(whole_losses, rel=REL)
    assert norms == pytest.approx(whole_norms, rel=1e-4)  # a norm of gradients ~1e-2 in size
    for name, tensor in whole.model.state_dict().items():
        torch.testing.assert_close(accumulated.model.state_dict()[name], tensor, rtol=1e-4,
                                   atol=1e-6, msg=name)
    half = run("train.batch_size=4")[0]
    assert half != pytest.approx(whole_losses, rel=REL)  # a smaller step batch is another run


def test_grad_accum_refuses_a_bad_value(tlab, tmp_path):
    code, _, err = tlab(*TINY, "train.grad_accum=0", f"hydra.run.dir={tmp_path}/bad")
    assert code == 2 and "train.grad_accum=0" in err and len(err.strip().splitlines()) <= 2
    assert not (tmp_path / "bad" / "metrics.csv").exists()


def test_only_one_train_run_goes_on_several_processes(tlab, tmp_path, monkeypatch):
    """Under torchrun (its environment, here without a process group): another routine or a
    sweep is refused in one line before anything is written."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    code, _, err = tlab("experiment=smoke", f"hydra.run.dir={tmp_path}/smoke")
    assert code == 2 and "routine=smoke cannot run on several processes (WORLD_SIZE=2)" in err
    code, _, err = tlab(*TINY, "-m", "train.lr=1e-2,1e-3", f"hydra.sweep.dir={tmp_path}/sweep")
    assert code == 2 and "a sweep (-m) cannot run under torchrun" in err
    assert not (tmp_path / "smoke").exists() and not (tmp_path / "sweep").exists()


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory) -> Path:
    """``tlab train --nproc 2`` at a global batch of 8: its run directory."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    done = tlab_processes("train", "--nproc", "2", *TINY[1:], f"hydra.run.dir={out}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("tlab train - ") == 1  # rank 1 prints no table
    return out


@pytest.mark.slow
def test_two_processes_give_the_losses_of_one_at_the_same_global_batch(ddp_run, tlab, tmp_path):
    single = tmp_path / "single"
    assert tlab(*TINY, f"hydra.run.dir={single}")[0] == 0
    one, two = read_csv(single / "metrics.csv"), read_csv(ddp_run / "metrics.csv")
    assert len(losses(two, "train")) == 8
    for split in ("train", "val"):
        assert losses(two, split) == pytest.approx(losses(one, split), rel=REL), split
    (summary,) = read_csv(ddp_run / "summary.csv")
    assert (summary["world_size"], summary["device"]) == ("2", "cpu")
    assert json.loads((ddp_run / "run.json").read_text())["world_size"] == 2
    assert read_csv(single / "summary.csv")[0]["world_size"] == "1"
    assert (ddp_run / WEIGHTS_FILE).is_file() and (ddp_run / CHECKPOINT_FILE).is_file()  # kept


@pytest.mark.slow
def test_a_killed_ddp_run_resumes_as_one_never_stopped(ddp_run, tmp_path):
    stopped = tmp_path / "stopped"
    env = {**os.environ, "STOP_AT": "7", "STOP_SIGNAL": "SIGKILL"}  # both ranks, before step 7
    killed = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(STOP_SCRIPT), *TINY, f"hydra.run.dir={stopped}"],
        env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0
    assert load_state(stopped / CHECKPOINT_FILE)["current"]["trainer"]["step"] == 6
    done = tlab_processes("train", "--nproc", "2", "--resume", stopped)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("metrics", "summary"):
        assert without_timings(read_csv(stopped / f"{name}.csv")) == \
            without_timings(read_csv(ddp_run / f"{name}.csv")), name
    a = load_trained(ddp_run / WEIGHTS_FILE).model.state_dict()
    b = load_trained(stopped / WEIGHTS_FILE).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    info = json.loads((stopped / "run.json").read_text())
    assert info["status"] == "passed" and info["world_size"] == 2 and len(info["resumes"]) == 1
