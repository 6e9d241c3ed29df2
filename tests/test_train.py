"""``tlab train``: one configuration on a task; held-out metrics as it goes and at the end,
``--seeds N`` with one-seed runs' numbers, ``tlab report`` pairing the seeds of a sweep."""

from __future__ import annotations

import math

import pytest
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.cli import app

# A 64-token synthetic language (offline) on the tiny model: a fraction of a second per seed.
TINY_LM = ["task=lm", "model=tiny", "task.eval_size=32", "train.batch_size=8", "train.lr=1e-2",
           "train.steps=60", "train.eval_every=20", "train.log_every=5", "train.warmup=5"]
TINY_REVERSE = ["task=reverse", "arch=encoder", "model=tiny", "task.eval_size=32",
                "train.batch_size=16", "train.lr=1e-2", "train.steps=30", "train.eval_every=10",
                "train.warmup=3"]
NUMBERS = ("params", "steps", "final_loss", "final_ppl", "final_accuracy")


def test_train_writes_its_files_and_the_held_out_loss_falls(tlab, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = tlab("experiment=train", *TINY_LM, f"hydra.run.dir={out}")
    assert code == 0, err
    assert {"metrics.csv", "summary.csv", "run.json", "config.yaml"} <= \
        {p.name for p in out.iterdir()}
    assert not (out / "seeds.csv").exists()  # one seed: its numbers are the summary's
    val = [r for r in read_csv(out / "metrics.csv") if r["split"] == "val"]
    assert [int(r["step"]) for r in val] == [20, 40, 60]  # every eval_every steps and the end
    losses = [float(r["loss"]) for r in val]
    assert losses[-1] < losses[0] < math.log(64)  # below chance (ln V), and still falling
    for row in val:  # perplexity of a language task: exp(held-out loss), 6 digits each
        assert float(row["ppl"]) == pytest.approx(math.exp(float(row["loss"])), rel=1e-4)
        assert row["exact_match"] == ""  # no exact match in language modelling
    (summary,) = read_csv(out / "summary.csv")
    assert (summary["routine"], summary["status"], summary["steps"]) == ("train", "passed", "60")
    assert float(summary["final_loss"]) == pytest.approx(losses[-1], rel=1e-5)
    assert float(summary["final_ppl"]) == pytest.approx(math.exp(losses[-1]), rel=1e-4)
    assert "held-out loss" in stdout and "ppl" in stdout  # the console table


def test_a_sequence_task_reports_exact_match_instead_of_perplexity(tlab, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = tlab("experiment=train", *TINY_REVERSE, f"hydra.run.dir={out}")
    assert code == 0, err
    val = [r for r in read_csv(out / "metrics.csv") if r["split"] == "val"]
    assert len(val) == 3 and all(0.0 <= float(r["exact_match"]) <= 1.0 for r in val)
    assert "ppl" not in val[0]
    (summary,) = read_csv(out / "summary.csv")
    assert float(summary["final_exact_match"]) == float(val[-1]["exact_match"])
    assert float(summary["best_exact_match"]) == max(float(r["exact_match"]) for r in val)
    assert "exact match" in stdout


def test_each_seed_of_a_multi_seed_run_has_the_numbers_of_its_own_run(tlab, tmp_path):
    code, _, err = tlab("experiment=train", *TINY_LM, "routine.seeds=2",
                        f"hydra.run.dir={tmp_path / 'two'}")
    assert code == 0, err
    rows = {row["seed"]: row for row in read_csv(tmp_path / "two" / "seeds.csv")}
    assert set(rows) == {"0", "1"}
    for seed in ("0", "1"):
        code, _, err = tlab("experiment=train", *TINY_LM, f"seed={seed}",
                            f"hydra.run.dir={tmp_path / seed}")
        assert code == 0, err
        (alone,) = read_csv(tmp_path / seed / "summary.csv")
        assert {k: rows[seed][k] for k in NUMBERS} == {k: alone[k] for k in NUMBERS}
    assert rows["0"]["final_loss"] != rows["1"]["final_loss"]  # two seeds, two runs
    (summary,) = read_csv(tmp_path / "two" / "summary.csv")
    mean = (float(rows["0"]["final_loss"]) + float(rows["1"]["final_loss"])) / 2
    assert float(summary["final_loss"]) == pytest.approx(mean, rel=1e-5)
    metrics = read_csv(tmp_path / "two" / "metrics.csv")
    assert {r["seed"] for r in metrics} == {"0", "1"}


def test_the_command_maps_its_options(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "--task", "lm", "--steps", "12", "--seeds", "2",
                                      "--optimizer", "sgd", "--pe", "alibi", "model=tiny",
                                      "task.eval_size=16", "train.batch_size=4", "--out",
                                      str(out)])
    assert result.exit_code == 0, result.output
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(out / "config.yaml")
    assert (cfg.task.name, cfg.train.steps, cfg.routine.seeds) == ("lm", 12, 2)
    assert (cfg.optimizer.name, cfg.pe.name) == ("sgd", "alibi")
    assert [r["steps"] for r in read_csv(out / "seeds.csv")] == ["12", "12"]


def test_tlab_report_pairs_the_seeds_of_a_train_sweep(tlab, tmp_path):
    sweep = tmp_path / "sweep"
    code, _, err = tlab("-m", "experiment=train", *TINY_LM, "train.steps=20", "pe=rope,none",
                        "routine.seeds=2", f"hydra.sweep.dir={sweep}")
    assert code == 0, err
    result = CliRunner().invoke(app, ["report", str(sweep), "--baseline", "pe=none",
                                      "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    pivot = {row["pe"]: row for row in read_csv(tmp_path / "r" / "report-pivot.csv")}
    assert {(pe, row["n_seeds"], row["seeds"]) for pe, row in pivot.items()} == {
        ("rope", "2", "0,1"), ("none", "2", "0,1")}
    assert pivot["none"]["verdict"] == "baseline"
    assert pivot["rope"]["paired_seeds"] == "2"
