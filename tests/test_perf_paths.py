"""Code paths of the fast training step, the GPU options and the CLI start-up (no timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.training.optim import clip_gradients
from transformer_lab.training.trainer import Trainer


def trainer_for(*overrides: str, seed: int = 0) -> Trainer:
    cfg = compose(["experiment=smoke", "train.batch_size=8", *overrides])
    task = build_task(cfg)
    torch.manual_seed(seed)
    return Trainer(build_model(cfg), task, cfg.train, cfg.model.d_model, seed)


def test_cli_start_up_imports_neither_torch_nor_hydra():
    """`tlab --help` / `tlab list` must stay light: no command module may import torch or
    hydra at import time (each command imports them inside its function)."""
    code = ("import json, sys; import transformer_lab.cli; "
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'hydra', 'omegaconf', 'pandas', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []


def test_clip_gradients_matches_clip_grad_norm():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)) for _ in range(3)]
    for p in params:
        p.grad = torch.randn_like(p) * 10
    expected_grads = [p.grad.clone() for p in params]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for r, g in zip(reference, expected_grads, strict=True):
        r.grad = g.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference, 1.0)
    norm = clip_gradients(params, 1.0)
    assert torch.equal(norm, expected_norm)
    for p, r in zip(params, reference, strict=True):
        assert torch.equal(p.grad, r.grad)
    assert clip_gradients(params, float("inf")) == pytest.approx(1.0, rel=1e-5)  # no clipping


def test_one_param_group_without_weight_decay_and_two_with_it():
    assert len(trainer_for().optimizer.param_groups) == 1
    assert len(trainer_for("train.weight_decay=0.1").optimizer.param_groups) == 2


def test_same_seed_gives_identical_losses():
    runs = [trainer_for("pe=rope", seed=3).fit(6).train_losses for _ in range(2)]
    assert runs[0] == runs[1]


def test_schedule_updates_reach_the_optimiser():
    trainer = trainer_for("train.schedule=warmup_cosine", "train.warmup=4", "train.lr=0.01")
    batch = trainer.task.train_batch(8, trainer.generator)
    lrs = []
    for _ in range(3):
        _, _, lr = trainer.train_step(batch)
        lrs.append(trainer.optimizer.param_groups[0]["lr"])
        assert lrs[-1] == lr
    assert lrs == pytest.approx([0.0025, 0.005, 0.0075])


def test_warmup_cosine_decays_over_the_steps_fit_is_asked_for():
    """A routine's budget (here 12 steps, train.steps=200 in the config) is the schedule's
    length: the last step is at the floor, not 6% of the way down."""
    lrs = []
    trainer = trainer_for("train.schedule=warmup_cosine", "train.warmup=2", "train.lr=0.01",
                          "train.min_lr_ratio=0.1", "train.steps=200", "train.log_every=1")
    trainer.fit(12, on_step=lambda step, loss: lrs.append(trainer._lr))
    assert lrs[1] == pytest.approx(0.01)  # warm-up done at step 2
    assert lrs[-1] == pytest.approx(0.001)  # the floor at step 12
    again = trainer_for("train.schedule=warmup_cosine", "train.warmup=2", "train.lr=0.01",
                        "train.min_lr_ratio=0.1", "train.log_every=1")
    horizon = []
    again.fit(6, horizon=12, on_step=lambda step, loss: horizon.append(again._lr))
    assert horizon == pytest.approx(lrs[:6])  # a run stopped early keeps the planned schedule


def test_bf16_autocast_path_trains_on_cpu():
    """train.precision=bf16 runs the model under autocast (the GPU recipe); on CPU too."""
    trainer = trainer_for("train.precision=bf16", "pe=rope")
    seen = []
    hook = trainer.model.blocks[0].attention.qkv_proj.register_forward_hook(
        lambda module, args, out: seen.append(out.dtype))
    batch = trainer.task.train_batch(8, trainer.generator)
    losses = [trainer.train_step(batch)[0] for _ in range(4)]
    hook.remove()
    assert seen == [torch.bfloat16] * 4
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # fp32 master
    assert all(torch.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]


def test_preflight_checks_the_device():
    from transformer_lab.app.preflight import preflight

    cfg = compose(["experiment=smoke", "train.device=cuda"])
    if torch.cuda.is_available():
        preflight(cfg)
        trainer = trainer_for("train.device=cuda", "train.precision=bf16")
        assert trainer.fit(2).steps == 2
    else:
        with pytest.raises(ConfigError, match="no CUDA device"):
            preflight(cfg)
    with pytest.raises(ConfigError, match="use cpu or cuda"):
        preflight(compose(["experiment=smoke", "train.device=tpu"]))


def test_no_op_dropout_and_scale_are_skipped_but_real_ones_apply():
    cfg = compose(["experiment=smoke", "model.dropout.residual=0.5",
                   "model.residual_scale=0.5"])
    build_task(cfg)  # fills model.vocab_size
    torch.manual_seed(0)
    model = build_model(cfg)
    block = model.blocks[0]
    y = torch.ones(2, 3, cfg.model.d_model)
    model.train()
    dropped = block.scale_and_drop(y)
    assert set(dropped.unique().tolist()) == {0.0, 1.0}  # 0.5 * y / (1 - 0.5) or 0
    model.eval()
    assert torch.equal(block.scale_and_drop(y), 0.5 * y)
    plain_cfg = compose(["experiment=smoke"])
    build_task(plain_cfg)  # fills model.vocab_size
    plain = build_model(plain_cfg)
    plain.train()
    assert plain.blocks[0].scale_and_drop(y) is y  # p = 0 and scale 1: no extra op


def test_benchmark_harness_runs_one_round(tmp_path):
    """The benchmark's own code path, one quick round of the tiny size (tlab and torch)."""
    root = str(Path(__file__).resolve().parents[1])  # benchmarks/ is not an installed package
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks.run import main

    out = tmp_path / "results.csv"
    assert main(["--sizes", "tiny", "--rounds", "1", "--steps-scale", "0.05",
                 "--no-x-transformers", "--out", str(out)]) == 0
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [r["impl"] for r in rows] == ["tlab", "torch", "tlab+data"]
    assert all(float(r["tokens_per_s"]) > 0 and float(r["tlab_ratio"]) > 0 for r in rows)
    assert rows[0]["tlab_ratio"] == "1.0"
