"""early_loss and late_loss_std (results/curve_metrics.py): their windows, the columns
compare-activations writes (recomputed here from metrics.csv), and ``tlab report --metric
early_loss | late_loss_std`` with paired verdicts (the norm-layers study's metrics)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np
import pytest
from helpers import read_csv

from transformer_lab.errors import ConfigError
from transformer_lab.results.curve_metrics import early_loss, late_loss_std
from transformer_lab.results.report import make_report

FAST = ["model=tiny", "model.d_model=16", "task.seq_len=8", "task.eval_size=32",
        "train.batch_size=8"]


def test_windows_are_the_first_10_and_last_30_percent_of_the_steps():
    steps = list(range(1, 601))
    losses = [float(s) for s in steps]  # loss = step: the window is visible in the numbers
    assert early_loss(steps, losses) == pytest.approx(30.5)  # steps 1..60
    assert late_loss_std(steps, losses) == pytest.approx(statistics.pstdev(range(421, 601)))
    # A coarse log (every 10th step of 100): early = step 10 alone, late = steps 80, 90, 100.
    coarse = list(range(10, 101, 10))
    assert early_loss(coarse, [float(s) for s in coarse]) == 10.0
    assert late_loss_std(coarse, [float(s) for s in coarse]) == pytest.approx(
        statistics.pstdev([80.0, 90.0, 100.0]))
    # No logged step in a window: NaN, not a number from outside it.
    assert math.isnan(early_loss([50, 100], [1.0, 2.0]))
    assert math.isnan(late_loss_std([50, 100], [1.0, 2.0]))  # one late point
    assert math.isnan(early_loss([], [])) and math.isnan(late_loss_std([], []))


def curve_numbers(metrics: list[dict[str, str]], activation: str, seed: str) -> tuple[float,
                                                                                      float]:
    """(early_loss, late_loss_std) recomputed by hand from metrics.csv's training rows."""
    rows = [r for r in metrics if r["split"] == "train" and r["variant"] == activation
            and r["seed"] == seed]
    steps = np.array([int(r["step"]) for r in rows])
    losses = np.array([float(r["loss"]) for r in rows])
    last = steps.max()
    return (float(losses[steps <= last // 10].mean()),
            float(losses[steps > last - (3 * last) // 10].std()))


def test_compare_writes_early_loss_and_late_loss_std_from_its_curves(tlab, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = tlab("experiment=compare_activations", "routine.activations=[relu,gelu]",
                             "routine.steps=40", "routine.seeds=2", *FAST,
                             f"hydra.run.dir={out}")
    assert code == 0, err
    metrics = read_csv(out / "metrics.csv")
    per_seed = read_csv(out / "compare_runs.csv")
    assert len(per_seed) == 4
    by_activation: dict[str, list[tuple[float, float]]] = {}
    for row in per_seed:
        early, late = curve_numbers(metrics, row["activation"], row["seed"])
        # metrics.csv keeps 6 significant digits of each loss, compare_runs.csv all of them
        assert float(row["early_loss"]) == pytest.approx(early, abs=1e-5)  # steps 1-4
        assert float(row["late_loss_std"]) == pytest.approx(late, abs=1e-5)  # steps 29-40
        assert float(row["late_loss_std"]) > 0
        by_activation.setdefault(row["activation"], []).append((early, late))
    for row in read_csv(out / "comparison.csv"):  # the seed means, 6 significant digits
        early, late = np.mean(by_activation[row["activation"]], axis=0)
        assert float(row["early_loss"]) == pytest.approx(early, abs=1e-5)
        assert float(row["late_loss_std"]) == pytest.approx(late, abs=1e-5)


def curve(norm: str, seed: int, steps: int = 100) -> np.ndarray:
    """batchnorm: 0.2 lower over the first steps, then a +-0.3 zig-zag; layernorm: smooth;
    rmsnorm: layernorm + 0.001 * (-1)^seed (no consistent difference)."""
    step = np.arange(1, steps + 1)
    base = 3.0 * np.exp(-step / 30) + 1.0 + 0.01 * seed
    if norm == "batchnorm":
        return base - 0.2 * (step <= 10) + 0.3 * (step > 70) * (-1.0) ** step
    return base + (0.001 * (-1) ** seed if norm == "rmsnorm" else 0.0)


def write_sweep(root: Path, seeds=range(7)) -> Path:
    """Runs as a sweep writes them: overrides.yaml, summary.csv and metrics.csv's train rows."""
    job = 0
    for norm in ("layernorm", "rmsnorm", "batchnorm"):
        for seed in seeds:
            run = root / str(job)
            (run / ".hydra").mkdir(parents=True)
            (run / ".hydra" / "overrides.yaml").write_text(f"- norm_layer={norm}\n- seed={seed}\n")
            (run / "summary.csv").write_text(f"norm_layer,seed,final_loss,status\n"
                                             f"{norm},{seed},{2.0 + 0.01 * seed},passed\n")
            losses = curve(norm, seed)
            (run / "metrics.csv").write_text("step,split,loss\n" + "".join(
                f"{i + 1},train,{float(loss)!r}\n" for i, loss in enumerate(losses)))
            job += 1
    return root


def test_report_gives_paired_verdicts_on_the_curve_metrics(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    early = make_report(sweep, tmp_path / "a", metric="early_loss",
                        baseline="norm_layer=layernorm")
    pivot = early.pivot.set_index("norm_layer")
    assert pivot.loc["batchnorm", "verdict"] == "better"  # lower early loss in every seed
    assert pivot.loc["rmsnorm", "verdict"] == "no detectable difference"
    assert float(pivot.loc["batchnorm", "diff_vs_baseline"]) == pytest.approx(-0.2)
    runs = read_csv(tmp_path / "a" / "report.csv")  # both numbers per run, by definition
    for row in runs:
        losses = curve(row["norm_layer"], int(row["seed"]))
        assert float(row["early_loss"]) == pytest.approx(losses[:10].mean())
        assert float(row["late_loss_std"]) == pytest.approx(losses[70:].std())
    late = make_report(sweep, tmp_path / "b", metric="late_loss_std",
                       baseline="norm_layer=layernorm")
    pivot = late.pivot.set_index("norm_layer")
    assert pivot.loc["batchnorm", "verdict"] == "worse"  # the zig-zag: larger std
    expected = curve("batchnorm", 0)[70:].std()
    assert float(pivot.loc["batchnorm", "late_loss_std_mean"]) == pytest.approx(expected,
                                                                                 rel=1e-3)
    assert "late_loss_std" in (tmp_path / "b" / "report.md").read_text()
    plain = make_report(sweep, tmp_path / "c")  # not asked for: not computed
    assert plain.metric == "final_loss" and "early_loss" not in plain.gathered.runs.columns
    with pytest.raises(ConfigError, match="available: final_loss, early_loss, late_loss_std"):
        make_report(sweep, tmp_path / "d", metric="bleu")


def test_report_takes_each_curve_of_a_run_before_averaging(tmp_path):
    """A job that trains two seeds together (seed-tagged rows in one metrics.csv): their
    zig-zags are out of phase, so averaging the curves first would cancel the oscillation."""
    sweep = tmp_path / "sweep"
    for job, norm in enumerate(("layernorm", "batchnorm")):
        run = sweep / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / ".hydra" / "overrides.yaml").write_text(f"- norm_layer={norm}\n")
        (run / "summary.csv").write_text(f"norm_layer,final_loss,status\n{norm},2.0,passed\n")
        rows = []
        for seed in (0, 1):
            losses = curve(norm, 0) * (1.0 if norm == "layernorm" else 0.0) + (
                0.3 * (-1.0) ** (np.arange(1, 101) + seed) + 2.0 if norm == "batchnorm" else 0.0)
            rows += [f"{i + 1},train,{float(loss)!r},{seed}\n" for i, loss in enumerate(losses)]
        (run / "metrics.csv").write_text("step,split,loss,seed\n" + "".join(rows))
    report = make_report(sweep, tmp_path / "r", metric="late_loss_std")
    runs = report.gathered.runs.set_index("norm_layer")
    assert float(runs.loc["batchnorm", "late_loss_std"]) == pytest.approx(0.3)  # not 0
    assert float(runs.loc["layernorm", "late_loss_std"]) == pytest.approx(
        curve("layernorm", 0)[70:].std())
