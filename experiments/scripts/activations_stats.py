"""Paired statistics for experiments/activations.md beyond ``comparison.csv``'s verdicts.

    python -m experiments.scripts.activations_stats [RUNS_CSV] [--metrics METRICS_CSV]
                                                    [--out-dir experiments]

Reads ``compare_runs.csv`` of ``tlab compare-activations`` (one row per activation and seed,
``final_loss`` in full precision) and writes, with ``transformer_lab.measures.statistics``
(paired by seed, t-intervals, sign-flip test, Holm):

    activations_verdicts.csv  verdict columns against a second baseline (swiglu, the best of the
                              paper) and the gradient-norm spread (``grad_norm_std``, lower =
                              steadier) against relu: ``metric``, ``baseline`` + the columns
                              of ``statistics.verdict_table``; with ``--metrics`` (the run's
                              metrics.csv) also the smoothed training loss at step 200 against
                              relu (the article's "GELU converges faster over the first 200
                              steps"; EMA 0.1, as tlab's loss curves)
    activations_pairs.csv     every pair of activations on ``final_loss`` (a - b, Holm over all
                              pairs), and the contrast "gated minus ungated" (per seed, mean of
                              reglu/geglu/swiglu minus mean of relu/gelu/swish, the paper's six)

Holm over the 28 pairs of eight activations needs 28 * 2 / 2^n <= 0.05 from the sign-flip test's
smallest p (2 / 2^n), so n >= 11 seeds before any pair can be told apart (12 to allow one seed
going the other way); against one baseline (7 tests) n >= 9 (10).

It also prints Kendall's tau between our order of mean held-out loss and the order of Shazeer
2020, Table 1 (log-perplexity after 65,536 and after 524,288 steps) over the six activations
both have.
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path

import numpy as np
import pandas as pd

from transformer_lab.measures.power_analysis import seeds_needed
from transformer_lab.measures.statistics import (
    holm,
    paired_comparison,
    verdict_table,
)

# Shazeer 2020, "GLU Variants Improve Transformer", Table 1: held-out log-perplexity (T5 base on
# C4, span filling) after 65,536 and after 524,288 steps
SHAZEER = {"65,536 steps": {"relu": 1.997, "gelu": 1.983, "swish": 1.994, "reglu": 1.953,
                            "geglu": 1.942, "swiglu": 1.944},
           "524,288 steps": {"relu": 1.677, "gelu": 1.679, "swish": 1.683, "reglu": 1.645,
                             "geglu": 1.633, "swiglu": 1.636}}
GATED, UNGATED = ["reglu", "geglu", "swiglu"], ["relu", "gelu", "swish"]
OUT_DIR = Path(__file__).resolve().parents[1]


EARLY_STEP = 200


def early_losses(metrics_csv: Path, step: int = EARLY_STEP) -> pd.DataFrame:
    """(activation, seed, train_loss_ema_step<step>): the smoothed training loss at ``step``."""
    from transformer_lab.routines.compare import SMOOTHING, ema

    metrics = pd.read_csv(metrics_csv)
    train = metrics[metrics["split"] == "train"].sort_values("step")
    rows = []
    for (activation, seed), group in train.groupby(["variant", "seed"], sort=False):
        smoothed = ema(group["loss"].tolist(), SMOOTHING)
        at = group["step"].tolist().index(step)
        rows.append({"activation": activation, "seed": seed,
                     f"train_loss_ema_step{step}": smoothed[at]})
    return pd.DataFrame(rows)


def second_verdicts(runs: pd.DataFrame) -> pd.DataFrame:
    """``verdict_table`` for (final_loss vs swiglu), (grad_norm_std vs relu) and, when ``runs``
    has it, (train_loss_ema_step200 vs relu)."""
    tables = []
    tests = [("final_loss", "swiglu"), ("grad_norm_std", "relu")]
    if f"train_loss_ema_step{EARLY_STEP}" in runs.columns:
        tests.append((f"train_loss_ema_step{EARLY_STEP}", "relu"))
    for metric, baseline in tests:
        table = verdict_table(runs, "activation", value=metric, baseline=baseline)
        table = table.rename(columns={f"{metric}_ci_low": "ci_low", f"{metric}_ci_high": "ci_high"})
        table.insert(0, "mean", runs.groupby("activation", sort=False)[metric].mean())
        table.insert(0, "baseline", baseline)
        table.insert(0, "metric", metric)
        tables.append(table.reset_index())
    return pd.concat(tables, ignore_index=True)


def pair_row(a: str, b: str, x: np.ndarray, y: np.ndarray, comparisons: int) -> dict:
    pair = paired_comparison(x, y)
    return {"a": a, "b": b, "diff_a_minus_b": pair.diff, "diff_ci_low": pair.low,
            "diff_ci_high": pair.high, "p_value": pair.p_value, "paired_seeds": pair.n,
            "seeds_needed": seeds_needed(pair.diff, pair.sd, comparisons=comparisons)}


def all_pairs(runs: pd.DataFrame) -> pd.DataFrame:
    """Every pair on final_loss (Holm over the pairs), plus the gated - ungated contrast
    (tested on its own)."""
    wide = runs.pivot(index="seed", columns="activation", values="final_loss")  # (seeds, acts)
    names = list(dict.fromkeys(runs["activation"]))
    pairs = list(itertools.combinations(names, 2))
    rows = [pair_row(a, b, wide[a].to_numpy(), wide[b].to_numpy(), len(pairs))
            for a, b in pairs]
    table = pd.DataFrame(rows)
    table["p_adjusted"] = holm(table["p_value"].to_numpy())
    table["holm_family"] = f"{len(pairs)} pairs"
    contrast = pair_row("gated (reglu, geglu, swiglu)", "ungated (relu, gelu, swish)",
                        wide[GATED].mean(axis=1).to_numpy(),
                        wide[UNGATED].mean(axis=1).to_numpy(), 1)
    contrast.update(p_adjusted=contrast["p_value"], holm_family="1 test")
    table = pd.concat([table, pd.DataFrame([contrast])], ignore_index=True)
    table["seeds_needed"] = table["seeds_needed"].astype("Int64")  # NaN: nothing to detect
    table["verdict"] = [
        "no detectable difference" if not p <= 0.05 else (f"{a} lower" if d < 0 else f"{b} lower")
        for a, b, d, p in table[["a", "b", "diff_a_minus_b", "p_adjusted"]].itertuples(index=False)]
    return table


def rank_agreement(runs: pd.DataFrame, paper: dict[str, float]) -> tuple[float, float, list[str]]:
    """Kendall's tau (and its exact p) between our mean final loss and one column of Table 1,
    and our order (best first) of the activations both have."""
    from scipy.stats import kendalltau

    ours = runs.groupby("activation")["final_loss"].mean()
    shared = [name for name in paper if name in ours.index]
    result = kendalltau([ours[n] for n in shared], [paper[n] for n in shared])
    return float(result.statistic), float(result.pvalue), sorted(shared, key=ours.get)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs_csv", type=Path, nargs="?",
                        default=OUT_DIR / "activations_runs.csv")
    parser.add_argument("--metrics", type=Path, default=None,
                        help="the run's metrics.csv: adds the step-200 training loss")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    runs = pd.read_csv(args.runs_csv)
    if args.metrics is not None:
        runs = runs.merge(early_losses(args.metrics), on=["activation", "seed"], how="left")
    verdicts, pairs = second_verdicts(runs), all_pairs(runs)
    verdicts.to_csv(args.out_dir / "activations_verdicts.csv", index=False, float_format="%.6g")
    pairs.to_csv(args.out_dir / "activations_pairs.csv", index=False, float_format="%.6g")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(verdicts[["metric", "baseline", "activation", "mean", "diff_vs_baseline",
                        "diff_ci_low", "diff_ci_high", "p_adjusted", "verdict", "seeds_needed"]])
        print(pairs[["a", "b", "diff_a_minus_b", "diff_ci_low", "diff_ci_high", "p_value",
                     "p_adjusted", "verdict", "seeds_needed"]].to_string())
    for column, paper in SHAZEER.items():
        tau, p, order = rank_agreement(runs, paper)
        print(f"order here (best first): {', '.join(order)}; Shazeer 2020 after {column}: "
              f"{', '.join(sorted(paper, key=paper.get))}; Kendall tau {tau:.3f} (p = {p:.3g}, "
              f"n = {len(order)}){'' if math.isfinite(tau) else ' (undefined)'}")
    print(f"wrote {args.out_dir / 'activations_verdicts.csv'}, "
          f"{args.out_dir / 'activations_pairs.csv'}")


if __name__ == "__main__":
    main()
