"""Seeds trained inside one job (``--seeds N``) are not lost: the job writes ``seeds.csv`` (one
row per seed, the numbers a one-seed run of that seed gets) and ``tlab report`` counts each of
its rows as a seed, so the pivot's seeds, mean ± std, CI and paired verdicts use every seed,
also in a folder mixing ``seed=0,1,2`` jobs with ``--seeds 3`` jobs."""

from __future__ import annotations

import logging
import shutil
import statistics
from pathlib import Path

import pytest
from helpers import read_csv

from transformer_lab.results.curve_metrics import curve_metric
from transformer_lab.results.report import make_report

SMOKE = ["experiment=smoke"]
REVERSE = ["experiment=reverse_task", "routine.max_steps=20", "routine.control=false",
           "task.eval_size=64", "train.eval_every=10", "model.d_model=16", "model.n_layers=1",
           "model.d_ff=32"]


def tlab_main(*args: str | Path) -> None:
    """Run tlab in-process (as conftest's ``smoke_sweep``); the run must pass or fail, not err."""
    from transformer_lab.app.hydra_app import main

    handlers = list(logging.root.handlers)
    try:
        code = main([str(a) for a in args])
    finally:
        logging.root.handlers[:] = handlers
    assert code in (0, 1), code


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """``seeds3/``: ``smoke --seeds 3 -m ffn=relu,gelu``; ``single/``: ``smoke -m ffn=relu
    seed=0,1,2`` (one seed per job); ``reverse/``: reverse-task ``--seeds 2`` and seed 1
    alone."""
    root = tmp_path_factory.mktemp("report_seeds")
    tlab_main("-m", *SMOKE, "routine.seeds=3", "ffn=relu,gelu",
              f"hydra.sweep.dir={root / 'seeds3'}")
    tlab_main("-m", *SMOKE, "ffn=relu", "seed=0,1,2", f"hydra.sweep.dir={root / 'single'}")
    tlab_main(*REVERSE, "routine.seeds=2", f"hydra.run.dir={root / 'reverse' / 'both'}")
    tlab_main(*REVERSE, "seed=1", f"hydra.run.dir={root / 'reverse' / 'seed1'}")
    return root


def number(value: str) -> float | None:
    return float(value) if value != "" else None


def test_a_multi_seed_job_writes_one_row_per_seed_and_keeps_one_summary_row(runs):
    for job in ("0", "1"):
        summary = read_csv(runs / "seeds3" / job / "summary.csv")
        seeds = read_csv(runs / "seeds3" / job / "seeds.csv")
        assert len(summary) == 1 and summary[0]["seed"] == "0"  # DESIGN: one row per run
        assert [row["seed"] for row in seeds] == ["0", "1", "2"]
        assert list(seeds[0]) == ["seed", "steps", "final_loss"]
        assert len({row["final_loss"] for row in seeds}) == 3  # each seed its own number
        assert float(summary[0]["final_loss"]) == pytest.approx(
            statistics.fmean(float(row["final_loss"]) for row in seeds), rel=1e-5)
    assert not any((runs / "single" / job / "seeds.csv").exists() for job in "012")


def test_each_seeds_row_equals_a_one_seed_run_of_that_seed(runs):
    together = read_csv(runs / "seeds3" / "0" / "seeds.csv")  # ffn=relu
    for seed, row in enumerate(together):
        (alone,) = read_csv(runs / "single" / str(seed) / "summary.csv")
        assert alone["activation"] == "relu" and alone["seed"] == str(seed)
        assert row["steps"] == alone["steps"]
        assert row["final_loss"] == alone["final_loss"]  # one after another: its own run
    by_seed = {row["seed"]: row for row in read_csv(runs / "reverse" / "both" / "seeds.csv")}
    assert set(by_seed) == {"0", "1"}
    assert float(by_seed["1"]["tokens_per_s"]) > 0  # each seed's own throughput
    (alone,) = read_csv(runs / "reverse" / "seed1" / "summary.csv")
    for column in ("steps", "params"):
        assert by_seed["1"][column] == alone[column]
    for column in ("final_loss", "best_exact_match", "solved_step"):
        together_value, alone_value = number(by_seed["1"][column]), number(alone[column])
        assert (together_value is None) == (alone_value is None), column
        if alone_value is not None:
            assert together_value == alone_value, column


def test_report_counts_every_seed_of_a_multi_seed_job(runs, tmp_path):
    report = make_report(runs / "seeds3", tmp_path / "r")
    pivot = {row["ffn"]: row for row in read_csv(tmp_path / "r" / "report-pivot.csv")}
    assert set(pivot) == {"relu", "gelu"}
    for job, ffn in (("0", "relu"), ("1", "gelu")):
        losses = [float(r["final_loss"]) for r in read_csv(runs / "seeds3" / job / "seeds.csv")]
        row = pivot[ffn]
        assert (row["n_runs"], row["n_passed"], row["n_seeds"], row["seeds"]) == (
            "1", "1", "3", "0,1,2")
        assert float(row["final_loss_mean"]) == pytest.approx(statistics.mean(losses))
        assert float(row["final_loss_std"]) == pytest.approx(statistics.stdev(losses))
        assert row["final_loss_ci_low"] != "" and row["paired_seeds"] in ("", "3")
    assert pivot["relu"]["verdict"] == "baseline"
    assert pivot["gelu"]["verdict"] in ("better", "worse", "no detectable difference")
    assert pivot["gelu"]["paired_seeds"] == "3"
    rows = read_csv(tmp_path / "r" / "report.csv")
    assert [(r["run_dir"], r["seed"]) for r in rows] == [
        (job, seed) for job in "01" for seed in "012"]
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert markdown.startswith(f"# Report: {runs / 'seeds3'}\n\n2 runs (2 passed)")
    assert "| relu | 1 | 1 | 0,1,2 |" in markdown and "## Verdicts" in markdown
    assert report.gathered.seeded == {"0", "1"}


def test_a_folder_mixing_one_seed_jobs_and_a_multi_seed_job_pairs_by_seed(runs, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(runs / "single", mixed / "single")          # relu, seed=0,1,2
    shutil.copytree(runs / "seeds3" / "1", mixed / "seeds3" / "1")  # gelu, --seeds 3
    report = make_report(mixed, tmp_path / "r", baseline="ffn=relu")
    assert report.gathered.group_keys == ["ffn"]  # routine.seeds (1 vs 3) is not a setting
    pivot = report.pivot.set_index("ffn")
    assert (pivot.loc["relu", "n_runs"], pivot.loc["relu", "seeds"]) == (3, "0,1,2")
    assert (pivot.loc["gelu", "n_runs"], pivot.loc["gelu", "seeds"]) == (1, "0,1,2")
    assert pivot.loc["gelu", "paired_seeds"] == 3 and pivot.loc["relu", "verdict"] == "baseline"
    relu = [float(r["final_loss"]) for r in read_csv(runs / "seeds3" / "0" / "seeds.csv")]
    assert pivot.loc["relu", "final_loss_mean"] == pytest.approx(statistics.mean(relu), rel=1e-4)


def test_curve_metrics_of_a_multi_seed_job_are_per_seed(runs, tmp_path):
    report = make_report(runs / "seeds3", tmp_path / "r", metric="early_loss")
    metrics = read_csv(runs / "seeds3" / "0" / "metrics.csv")
    rows = report.gathered.runs[report.gathered.runs["run_dir"] == "0"]
    for seed, value in zip(rows["seed"], rows["early_loss"], strict=True):
        curve = [r for r in metrics if r["seed"] == str(seed) and r["split"] == "train"]
        expected = curve_metric("early_loss", [int(r["step"]) for r in curve],
                                [float(r["loss"]) for r in curve])
        assert value == pytest.approx(expected)
    assert rows["early_loss"].nunique() == 3


def test_without_seeds_csv_a_job_is_one_row_as_before(runs, tmp_path):
    sweep = tmp_path / "sweep"
    shutil.copytree(runs / "seeds3", sweep)
    (sweep / "0" / "seeds.csv").unlink()
    (sweep / "1" / "seeds.csv").write_text("seed,final_loss\n0,1.0\n0,2.0\n")  # corrupt
    report = make_report(sweep, tmp_path / "r")
    rows = read_csv(tmp_path / "r" / "report.csv")
    assert [(r["run_dir"], r["seed"]) for r in rows] == [("0", "0"), ("1", "0")]
    for row, job in zip(rows, "01", strict=True):
        assert row["final_loss"] == read_csv(sweep / job / "summary.csv")[0]["final_loss"]
    assert report.pivot["n_runs"].tolist() == report.pivot["n_seeds"].tolist() == [1, 1]
    assert "verdict" not in report.pivot.columns  # one seed per group: nothing to pair
    assert [(p.name, why) for p, why in report.gathered.skipped] == [
        ("seeds.csv", "ValueError: a seed missing or twice (counted as one run)")]


def write_run(run_dir: Path, pe: str, status: str, seeds: list[int],
              curves: dict[tuple[str, int], list[float]]) -> None:
    """A run folder by hand: ``summary.csv`` (seed ``seeds[0]``), ``seeds.csv`` with 2+ seeds
    (``final_loss`` = 10 x seed) and ``metrics.csv`` with one training curve per (variant, seed)."""
    run_dir.mkdir(parents=True)
    (run_dir / "summary.csv").write_text(
        f"routine,pe,seed,final_loss,status\nreverse,{pe},{seeds[0]},1.0,{status}\n")
    if len(seeds) > 1:
        (run_dir / "seeds.csv").write_text(
            "seed,final_loss\n" + "".join(f"{s},{10.0 * s}\n" for s in seeds))
    rows = [f"reverse,{variant},{seed},train,{step},{loss}\n"
            for (variant, seed), losses in curves.items() for step, loss in enumerate(losses, 1)]
    (run_dir / "metrics.csv").write_text("stage,variant,seed,split,step,loss\n" + "".join(rows))


def test_a_seeds_curve_metric_leaves_out_its_nope_control(tmp_path):
    """reverse-task with ALiBi in an encoder tags its curves ``alibi(abs)`` (the table label),
    its controls ``none``: each seed's row gets its own PE curve's number, not the control's."""
    own = {("alibi(abs)", 0): [1.0] * 10, ("alibi(abs)", 1): [2.0] * 10}
    control = {("none", 0): [9.0] * 10, ("none", 1): [9.0] * 10}
    write_run(tmp_path / "runs" / "a", "alibi", "passed", [0, 1], {**own, **control})
    report = make_report(tmp_path / "runs", tmp_path / "r", metric="early_loss")
    rows = report.gathered.runs
    assert rows["seed"].tolist() == [0, 1]
    assert rows["early_loss"].tolist() == [1.0, 2.0]
    assert rows["final_loss"].tolist() == [0.0, 10.0]  # each seed's own numbers (seeds.csv)
    assert set(report.gathered.curves["curve"]) == {"reverse/alibi(abs)/0", "reverse/alibi(abs)/1"}


def test_a_failed_multi_seed_job_is_one_failed_run_of_several_samples(tmp_path):
    """A ``--seeds 3`` job that failed (a seed did not solve) beside a passed one-seed job: the
    pivot counts 2 run folders, 1 passed, 4 samples; report.md lists the failed job once."""
    curve = {("rope", 0): [1.0, 0.5]}
    write_run(tmp_path / "runs" / "a", "rope", "failed", [0, 1, 2], curve)
    write_run(tmp_path / "runs" / "b", "rope", "passed", [3], curve)
    report = make_report(tmp_path / "runs", tmp_path / "r")
    (row,) = report.pivot.to_dict("records")
    assert (row["n_runs"], row["n_passed"], row["n_seeds"], row["seeds"]) == (2, 1, 4, "0,1,2,3")
    assert row["final_loss_mean"] == pytest.approx(statistics.mean([0.0, 10.0, 20.0, 1.0]))
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "2 runs (1 failed, 1 passed) (1 of them trained several seeds" in markdown
    failed = markdown.split("## Runs that did not pass")[1].split("##")[0]
    assert failed.count("| a |") == 1 and "| b |" not in failed
