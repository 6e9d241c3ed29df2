"""``tlab report`` over runs that vary ``seed_init`` and ``seed_data``: the report metric's
variance split into the two sources and a residual per group (report-variance.csv, report.md),
and verdicts paired by both seeds (run folders written by hand: config.yaml, Hydra's
overrides.yaml, summary.csv)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import read_csv

from transformer_lab.results.report import make_report

INIT = np.array([0.0, 0.03, -0.01])        # each init seed's effect
DATA = np.array([0.02, -0.02, 0.05, 0.0])  # each data-order seed's effect
U, V = np.array([1.0, 0.0, -1.0]), np.array([1.0, -1.0, 1.0, -1.0])  # rows, columns sum to 0


def loss(pe: str, i: int, j: int) -> float:
    """none: additive in the two seeds; rope: 0.1 higher plus an init x data interaction."""
    if pe == "rope":
        return 2.1 + INIT[i] + DATA[j] + 0.01 * U[i] * V[j]
    return 2.0 + INIT[i] + DATA[j]


def write_run(run: Path, overrides: list[str], config: dict[str, int], pe: str, seed: int,
              value: float) -> None:
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
    (run / "summary.csv").write_text("pe,seed,final_loss,status\n"
                                     f"{pe},{seed},{float(value)!r},passed\n")


def write_crossed_sweep(root: Path, skip: tuple[str, int, int] | None = None) -> Path:
    job = 0
    for pe in ("none", "rope"):
        for i in range(len(INIT)):
            for j in range(len(DATA)):
                if (pe, i, j) != skip:
                    write_run(root / str(job), [f"pe={pe}", f"seed_init={i}", f"seed_data={j}"],
                              {"seed": 0, "seed_init": i, "seed_data": j}, pe, 0, loss(pe, i, j))
                job += 1
    return root


def test_the_decomposition_recovers_each_groups_variance_structure(tmp_path):
    report = make_report(write_crossed_sweep(tmp_path / "sweep"), tmp_path / "r")
    rows = {r["pe"]: r for r in read_csv(tmp_path / "r" / "report-variance.csv")}
    none, rope = rows["none"], rows["rope"]
    assert (none["metric"], none["n_init"], none["n_data"]) == ("final_loss", "3", "4")
    assert float(none["var_init"]) == pytest.approx(INIT.var(ddof=1), abs=1e-12)
    assert float(none["var_data"]) == pytest.approx(DATA.var(ddof=1), abs=1e-12)
    assert float(none["var_residual"]) == pytest.approx(0.0, abs=1e-12)
    assert float(none["mean"]) == pytest.approx(2.0 + INIT.mean() + DATA.mean())
    total = INIT.var(ddof=1) + DATA.var(ddof=1)
    assert float(none["share_data"]) == pytest.approx(DATA.var(ddof=1) / total)
    residual = 0.01 ** 2 * (U ** 2).sum() * (V ** 2).sum() / (2 * 3)  # by hand: MS_residual
    assert float(rope["var_residual"]) == pytest.approx(residual)
    assert float(rope["var_init"]) == pytest.approx(INIT.var(ddof=1) - residual / 4)
    assert float(rope["var_data"]) == pytest.approx(DATA.var(ddof=1) - residual / 3)
    assert float(rope["var_total"]) == pytest.approx(
        float(rope["var_init"]) + float(rope["var_data"]) + residual)
    text = (tmp_path / "r" / "report.md").read_text()
    assert "## Variance by source (final_loss over seed_init x seed_data)" in text
    assert f"| none | 3 x 4 | {float(none['mean']):.4g} | {INIT.var(ddof=1):.3g} (" in text
    # seed_init and seed_data are samples: not grouped by, and they pair the verdicts
    assert report.gathered.group_keys == ["pe"] and len(report.pivot) == 2
    pivot = {r["pe"]: r for r in read_csv(tmp_path / "r" / "report-pivot.csv")}
    assert pivot["rope"]["verdict"] == "worse" and pivot["rope"]["paired_seeds"] == "12"
    assert float(pivot["rope"]["diff_vs_baseline"]) == pytest.approx(0.1)
    cells = [(i, j) for i in range(len(INIT)) for j in range(len(DATA))]
    wins = [loss("rope", *a) < loss("none", *b) for a in cells for b in cells if a != b]
    assert float(pivot["rope"]["p_improvement"]) == pytest.approx(sum(wins) / len(wins))


def test_absent_keys_are_the_runs_seed_and_an_incomplete_crossing_is_named(tmp_path):
    """Runs that set only seed_data: their seed is their init seed."""
    root = tmp_path / "sweep"
    for job, (seed, j) in enumerate((s, j) for s in range(3) for j in range(4)):
        write_run(root / str(job), [f"seed={seed}", f"seed_data={j}"], {"seed": seed,
                  "seed_data": j}, "none", seed, loss("none", seed, j))
    make_report(root, tmp_path / "r")
    (row,) = read_csv(tmp_path / "r" / "report-variance.csv")
    assert float(row["var_init"]) == pytest.approx(INIT.var(ddof=1), abs=1e-12)
    assert float(row["var_data"]) == pytest.approx(DATA.var(ddof=1), abs=1e-12)
    runs = read_csv(tmp_path / "r" / "report.csv")
    assert [(r["seed_init"], r["seed_data"]) for r in runs[:2]] == [("0", "0"), ("0", "1")]

    incomplete = write_crossed_sweep(tmp_path / "incomplete", skip=("rope", 1, 2))
    report = make_report(incomplete, tmp_path / "r2")
    rows = {r["pe"]: r for r in read_csv(tmp_path / "r2" / "report-variance.csv")}
    assert rows["rope"]["note"] == ("1 of 12 cells have no value: needs every seed_init x "
                                    "seed_data pair") and rows["rope"]["var_init"] == ""
    assert rows["none"]["note"] == "" and float(rows["none"]["var_init"]) > 0
    assert report.variance is not None and math.isnan(report.variance.iloc[1]["var_init"])


def test_without_seed_sources_there_is_no_variance_report(tmp_path):
    root = tmp_path / "sweep"
    for job, (pe, seed) in enumerate((p, s) for p in ("none", "rope") for s in range(3)):
        write_run(root / str(job), [f"pe={pe}", f"seed={seed}"], {"seed": seed}, pe, seed,
                  loss(pe, seed, 0))
    report = make_report(root, tmp_path / "r")
    assert report.variance is None and not (tmp_path / "r" / "report-variance.csv").exists()
    assert "seed_init" not in read_csv(tmp_path / "r" / "report.csv")[0]
    assert "Variance by source" not in (tmp_path / "r" / "report.md").read_text()
