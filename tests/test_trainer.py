"""The training loop (``training.trainer``): torch's optimiser and clipping, the schedule,
bf16, seeds one after another with their own runs' numbers; and the CLI start-up."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.training.schedules import schedule
from transformer_lab.training.trainer import Trainer, TrainSettings


def trainer_for(*overrides: str, seed: int = 0) -> Trainer:
    spec = RunSpec.of(compose(["experiment=smoke", "train.batch_size=8", *overrides]))
    task = build_task(spec)
    model = build_model(spec.with_vocab(task.vocab_size).model, seed=seed)
    return Trainer(model, task, spec.train, seed)


def test_cli_start_up_imports_neither_torch_nor_hydra():
    """`tlab --help` / `tlab list` must stay light: no command module may import torch or
    hydra at import time (each command imports them inside its function)."""
    code = ("import json, sys; import transformer_lab.cli; "
            "print(json.dumps(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('torch', 'hydra', 'omegaconf', 'pandas', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out) == []


def test_the_logged_norm_is_before_clipping_and_the_step_uses_clipped_gradients():
    trainer = trainer_for("train.grad_clip=0.001", "train.lr=0.01")
    batch = trainer.task.train_batch(8, trainer.generator)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    _, norm, _ = trainer.train_step(batch)
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    clipped = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    assert norm.item() > 0.01  # the norm before clipping, far above the limit
    assert clipped.item() == pytest.approx(0.001, rel=1e-3)  # max_norm / (norm + 1e-6) applied
    moved = [p for p, b in zip(trainer.model.parameters(), before, strict=True)
             if not torch.equal(p, b)]
    assert moved  # AdamW stepped


def test_torch_adamw_decays_matrices_only():
    trainer = trainer_for()
    assert isinstance(trainer.optimizers[0], torch.optim.AdamW)
    assert len(trainer.optimizers[0].param_groups) == 1
    groups = trainer_for("train.weight_decay=0.1").optimizers[0].param_groups
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert all(p.dim() >= 2 for p in groups[0]["params"])
    assert all(p.dim() < 2 for p in groups[1]["params"]) and groups[1]["params"]
    assert groups[0]["betas"] == (0.9, 0.98)  # train.betas


def test_bad_train_settings_name_the_key():
    with pytest.raises(ConfigError, match="train.precision=fp16 is not valid; it must be one of "
                                          "fp32, bf16"):
        TrainSettings.from_mapping({"precision": "fp16"}, d_model=8)
    with pytest.raises(ConfigError, match="train.schedule='linear' is not known; valid: constant"):
        schedule("linear")  # what the pre-flight, compare's variants and the trainer ask


def test_seeds_train_one_after_another_with_their_own_runs_numbers(tlab, tmp_path):
    import csv

    code, out, err = tlab("experiment=smoke", "routine.seeds=2", f"hydra.run.dir={tmp_path}/two")
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "two" / "smoke.csv").open()))
    seed_rows = [r for r in rows if r["check"].startswith("smoke_loss_falls")]
    assert [r["check"] for r in seed_rows] == ["smoke_loss_falls[seed=0]",
                                               "smoke_loss_falls[seed=1]"]
    metrics = list(csv.DictReader((tmp_path / "two" / "metrics.csv").open()))
    assert {r["seed"] for r in metrics} == {"0", "1"}
    code, _, err = tlab("experiment=smoke", "seed=1", f"hydra.run.dir={tmp_path}/one")
    assert code == 0, err
    single = [r for r in csv.DictReader((tmp_path / "one" / "smoke.csv").open())
              if r["check"] == "smoke_loss_falls"]
    assert single[0]["value"] == seed_rows[1]["value"]  # the same run: the same numbers
    code, _, err = tlab("experiment=smoke", "routine.seeds=0", f"hydra.run.dir={tmp_path}/bad")
    assert code == 2 and "routine.seeds=0" in err


def test_same_seed_gives_identical_losses():
    runs = [trainer_for("pe=rope", seed=3).fit(6).train_losses for _ in range(2)]
    assert runs[0] == runs[1]


def test_schedule_updates_reach_the_optimiser():
    trainer = trainer_for("train.schedule=warmup_cosine", "train.warmup=4", "train.lr=0.01")
    batch = trainer.task.train_batch(8, trainer.generator)
    lrs = []
    for _ in range(3):
        _, _, lr = trainer.train_step(batch)
        lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        assert lrs[-1] == lr
    assert lrs == pytest.approx([0.0025, 0.005, 0.0075])


def test_warmup_cosine_decays_over_the_steps_fit_is_asked_for():
    """A routine's budget (here 12 steps, train.steps=200 in the config) is the schedule's
    length: the last step is at the floor, not 6% of the way down."""
    lrs = []
    trainer = trainer_for("train.schedule=warmup_cosine", "train.warmup=2", "train.lr=0.01",
                          "train.min_lr_ratio=0.1", "train.steps=200", "train.log_every=1")
    trainer.fit(12, on_step=lambda step, loss: lrs.append(
        trainer.optimizers[0].param_groups[0]["lr"]))
    assert lrs[1] == pytest.approx(0.01)  # warm-up done at step 2
    assert lrs[-1] == pytest.approx(0.001)  # the floor at step 12
    again = trainer_for("train.schedule=warmup_cosine", "train.warmup=2", "train.lr=0.01",
                        "train.min_lr_ratio=0.1", "train.log_every=1")
    horizon = []
    again.fit(6, horizon=12,
              on_step=lambda step, loss: horizon.append(again.optimizers[0].param_groups[0]["lr"]))
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
    with pytest.raises(ConfigError, match="train.device='tpu' is not valid; use auto, cpu or cuda"):
        preflight(compose(["experiment=smoke", "train.device=tpu"]))


def test_auto_device_is_cuda_where_torch_sees_one_else_the_cpu(tlab, tmp_path):
    """train.device=auto (tlab train's default) trains where torch finds a GPU; run.json and
    summary.csv name the device it resolved to."""
    from transformer_lab.training.distributed import resolve_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto") == torch.device(expected)
    assert resolve_device("cpu") == torch.device("cpu")
    out = tmp_path / "run"
    code, _, err = tlab("experiment=train", "task=lm", "model=tiny", "task.eval_size=16",
                        "train.steps=3", "train.batch_size=4", f"hydra.run.dir={out}")
    assert code == 0, err
    from omegaconf import OmegaConf

    assert OmegaConf.load(out / "config.yaml").train.device == "auto"
    assert json.loads((out / "run.json").read_text())["device"] == expected
    (row,) = csv.DictReader((out / "summary.csv").open())
    assert (row["device"], row["world_size"]) == (expected, "1")
    assert 0 < float(row["mfu"]) < 1 and float(row["step_ms"]) > 0


def test_no_op_dropout_and_scale_are_skipped_but_real_ones_apply(spec_for):
    spec, _ = spec_for("model.dropout.residual=0.5", "model.residual_scale=0.5")
    torch.manual_seed(0)
    model = build_model(spec.model)
    block = model.blocks[0]
    y = torch.ones(2, 3, spec.model.d_model)
    model.train()
    dropped = block.scale_and_drop(y)
    assert set(dropped.unique().tolist()) == {0.0, 1.0}  # 0.5 * y / (1 - 0.5) or 0
    model.eval()
    assert torch.equal(block.scale_and_drop(y), 0.5 * y)
    plain = build_model(spec_for()[0].model)
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
