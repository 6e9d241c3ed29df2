"""``tlab report`` over a sweep with a seed key: per group the metric's 95% CI and, against the
baseline group, the paired verdict columns, computed within the groups that differ only in the
compared key (runs written by hand: each is a summary.csv and Hydra's overrides.yaml)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest
from helpers import read_csv
from scipy import stats
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.results.report import make_report

SEEDS = range(7)  # two groups tested against the baseline: 7 seeds leave Holm room at 0.05


def loss(pe: str, d_model: int, seed: int) -> float:
    """none: a seed effect; rope: 0.5 lower at d_model 16, 0.3 higher at 32 (every seed);
    alibi: none -/+ 0.01 by seed parity (no consistent difference)."""
    base = 2.0 + 0.05 * seed + (0.1 if d_model == 32 else 0.0)
    if pe == "rope":
        return base + (-0.5 if d_model == 16 else 0.3) + 0.001 * (seed % 3)
    if pe == "alibi":
        return base + 0.01 * (-1) ** seed
    return base


def write_sweep(root: Path, pes: tuple[str, ...] = ("none", "rope", "alibi"),
                d_models: tuple[int, ...] = (16, 32), seeds=SEEDS) -> Path:
    job = 0
    for d_model in d_models:
        for pe in pes:
            for seed in seeds:
                run = root / str(job)
                (run / ".hydra").mkdir(parents=True)
                overrides = [f"pe={pe}", f"seed={seed}"]
                if len(d_models) > 1:
                    overrides.append(f"model.d_model={d_model}")
                (run / ".hydra" / "overrides.yaml").write_text(
                    "".join(f"- {item}\n" for item in overrides))
                (run / "summary.csv").write_text(
                    "pe,seed,final_loss,status\n"
                    f"{pe},{seed},{loss(pe, d_model, seed)!r},passed\n")
                job += 1
    return root


def cli(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    text = result.output
    with contextlib.suppress(ValueError):  # older Click: stderr already mixed into output
        text += result.stderr
    return result.exit_code, " ".join(text.split())


def test_verdicts_per_stratum_against_the_baseline_group(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    code, output = cli("report", sweep, "--baseline", "pe=none", "--out", tmp_path / "r")
    assert code == 0, output
    pivot = {(r["model.d_model"], r["pe"]): r for r in read_csv(tmp_path / "r" /
                                                               "report-pivot.csv")}
    assert len(pivot) == 6
    for d_model, rope_verdict in (("16", "better"), ("32", "worse")):
        none, rope, alibi = (pivot[(d_model, pe)] for pe in ("none", "rope", "alibi"))
        assert none["verdict"] == "baseline" and none["baseline"] == "pe=none"
        assert rope["verdict"] == rope_verdict
        assert alibi["verdict"] == "no detectable difference"
        # by hand: paired by seed within this d_model only
        x = np.array([loss("rope", int(d_model), s) for s in SEEDS])
        y = np.array([loss("none", int(d_model), s) for s in SEEDS])
        assert float(rope["diff_vs_baseline"]) == pytest.approx((x - y).mean(), rel=1e-5)
        interval = stats.ttest_rel(x, y).confidence_interval(0.95)
        assert float(rope["diff_ci_low"]) == pytest.approx(interval.low, rel=1e-5)
        assert float(rope["diff_ci_high"]) == pytest.approx(interval.high, rel=1e-5)
        assert float(rope["p_value"]) == pytest.approx(2 / 2 ** 7)
        assert float(rope["p_adjusted"]) == pytest.approx(2 * 2 / 2 ** 7)  # Holm: smallest p
        low, high = stats.t.interval(0.95, 6, loc=x.mean(), scale=stats.sem(x))
        assert float(rope["final_loss_ci_low"]) == pytest.approx(low, rel=1e-5)
        assert float(rope["final_loss_ci_high"]) == pytest.approx(high, rel=1e-5)
        assert rope["paired_seeds"] == "7"
    line = "pe=rope (model.d_model=16) vs pe=none: final_loss 0.499 lower"
    assert line in output
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "## Verdicts" in markdown and line in markdown
    assert "| verdict |" in markdown and "| better |" in markdown


def test_default_baseline_is_the_first_group_and_another_can_be_chosen(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", d_models=(16,))
    report = make_report(sweep, tmp_path / "a")
    assert report.gathered.group_keys == ["pe"]
    verdicts = dict(zip(report.pivot["pe"], report.pivot["verdict"], strict=True))
    assert verdicts == {"none": "baseline", "rope": "better",
                        "alibi": "no detectable difference"}
    report = make_report(sweep, tmp_path / "b", baseline="rope")  # VALUE alone: its key found
    verdicts = dict(zip(report.pivot["pe"], report.pivot["verdict"], strict=True))
    assert verdicts == {"none": "worse", "rope": "baseline", "alibi": "worse"}


@pytest.mark.parametrize("baseline, message", [
    ("pe=t5", "no group has pe=t5; valid: pe=none, pe=rope, pe=alibi"),
    ("norm=pre", "'norm' is not a grouped key; valid: model.d_model, pe"),
])
def test_unknown_baseline_exits_2_naming_the_valid_ones(tmp_path, baseline, message):
    sweep = write_sweep(tmp_path / "sweep")
    code, output = cli("report", sweep, "--baseline", baseline, "--out", tmp_path / "r")
    assert code == 2 and message in output and "Traceback" not in output


def test_no_seed_key_no_verdicts(tmp_path):
    sweep = write_sweep(tmp_path / "sweep", d_models=(16,), seeds=[0])
    report = make_report(sweep, tmp_path / "r")
    assert "verdict" not in report.pivot.columns
    assert "Verdicts" not in (tmp_path / "r" / "report.md").read_text()
