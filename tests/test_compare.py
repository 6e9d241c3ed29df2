"""tlab compare-activations: comparison.csv, same init and data for every activation, bad input."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import assert_refused, read_csv

from transformer_lab.config.variants import with_choice
from transformer_lab.model import build_model
from transformer_lab.routines.compare import (
    COMPARISON_COLUMNS,
    SeedRun,
    comparison_rows,
    ema,
    smoothed,
    steps_to_target,
    train_seed,
)
from transformer_lab.training.trainer import TrainResult

# A small model that trains in a fraction of a second per activation.
FAST = ["model=tiny", "model.d_model=16", "task.seq_len=8", "task.eval_size=32",
        "train.batch_size=8"]



def test_compare_cli_writes_rows_for_each_activation(tlab, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, _ = tlab("experiment=compare_activations",
                           "routine.activations=[relu,gelu,swish]", "routine.steps=12",
                           "routine.seeds=2", *FAST, f"hydra.run.dir={out}")
    assert code == 0, stdout
    rows = read_csv(out / "comparison.csv")
    assert list(rows[0])[: len(COMPARISON_COLUMNS)] == COMPARISON_COLUMNS
    assert [r["activation"] for r in rows] == ["relu", "gelu", "swish"]
    for row in rows:
        for column in ("params", "ffn_params", "tokens_per_s", "rel_speed", "final_loss",
                       "final_ppl", "grad_norm_mean", "grad_norm_std"):
            assert math.isfinite(float(row[column])), (row["activation"], column)
        assert row["seeds"] == "2"
        assert math.isclose(float(row["final_ppl"]), math.exp(float(row["final_loss"])),
                            rel_tol=1e-4)
    assert float(rows[0]["rel_speed"]) == 1.0
    # The default loss target is reached by every run, so every activation has a step.
    assert all(row["steps_to_target"] for row in rows)
    per_seed = read_csv(out / "compare_runs.csv")
    assert sorted((r["activation"], r["seed"]) for r in per_seed) == sorted(
        (a, s) for a in ("relu", "gelu", "swish") for s in ("0", "1"))
    assert (out / "loss_curves.png").stat().st_size > 1000
    metrics = read_csv(out / "metrics.csv")
    assert {(r["variant"], r["seed"]) for r in metrics} == {
        (a, s) for a in ("relu", "gelu", "swish") for s in ("0", "1")}
    assert "relu" in stdout and "gelu" in stdout  # the rich table


def test_every_activation_sees_the_same_init_and_batches(spec_for):
    spec, task = spec_for("experiment=compare_activations", *FAST, "routine.steps=3")
    relu, gelu = (with_choice(spec, "ffn", name) for name in ("relu", "gelu"))
    weights = [build_model(variant.model, seed=variant.seed).state_dict()
               for variant in (relu, gelu)]
    assert weights[0].keys() == weights[1].keys()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name
    # Equal inits and equal batches give the same losses exactly for the same activation,
    # different ones for a different activation.
    first = train_seed(relu, task, 0, None)[0].result
    again = train_seed(with_choice(spec, "ffn", "relu"), task, 0, None)[0].result
    assert first.train_losses == again.train_losses
    assert train_seed(gelu, task, 0, None)[0].result.train_losses != first.train_losses


def test_seeds_match_runs_of_their_own(spec_for):
    """compare-activations --seeds 3 gives each seed the numbers of a one-seed comparison."""
    spec, task = spec_for("experiment=compare_activations", *FAST, "routine.steps=8")
    spec = with_choice(spec, "ffn", "swish")
    together = [train_seed(spec, task, seed, None)[0] for seed in (4, 5, 6)]
    for run in together:
        alone = train_seed(replace(spec, seed=run.seed), task, run.seed, None)[0]
        r, a = run.result, alone.result
        assert r.train_losses == a.train_losses  # the same run: the same numbers
        assert r.grad_norms == a.grad_norms
        assert r.final_loss == a.final_loss
        assert (run.params, run.parts, r.steps) == (alone.params, alone.parts, 8)
    assert together[0].result.train_losses != together[1].result.train_losses


def test_ema_and_steps_to_target():
    assert ema([4.0, 2.0, 2.0], 0.5) == [4.0, 3.0, 2.5]
    result = TrainResult(steps=3, final_loss=1.0, wall_s=0.1, train_losses=[4.0, 2.0, 2.0],
                         grad_norms=[1.0, 1.0, 1.0])
    run = SeedRun("relu", 0, result, 1, {"activation": "relu", "gated_ffn": False}, [1, 2, 3],
                  {"ffn": 1})
    assert smoothed(run) == pytest.approx([4.0, 3.8, 3.62])  # EMA weight 0.1
    assert steps_to_target(run, 3.81) == 2
    assert steps_to_target(run, 3.0) is None
    rows = comparison_rows([run], None)  # default target: the worst final smoothed loss
    assert rows[0]["loss_target"] == pytest.approx(3.62)
    assert rows[0]["steps_to_target"] == 3


@pytest.mark.parametrize(("args", "message"), [
    (["routine.activations=[relu,foo]"], "unknown activation 'foo'"),
    (["routine.seeds=0"], "routine.seeds=0"),
    (["routine.activations=[relu,relu]"], "twice"),
    (["task=lm", "arch=encoder"], "needs arch=decoder"),
])
def test_bad_input_exits_2_before_writing(tlab, tmp_path, args, message):
    out = tmp_path / "bad"
    assert_refused(tlab("experiment=compare_activations", *args, f"hydra.run.dir={out}"), out,
                   message)


def test_cli_options_are_checked(tmp_path):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["compare-activations", "--seeds", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--seeds" in result.output
    result = runner.invoke(app, ["compare-activations", "--activations", "relu,nope",
                                 "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert not (tmp_path / "x").exists()
