"""Expert utilisation and the load-balancing contrasts for experiments/moe.md, with the figure.

    python -m experiments.scripts.moe_stats runs/moe [--control runs/moe_soft]
                                             [--depth runs/moe_depth] [--out-dir experiments]

Reads the ``tlab compare-activations`` run directory (``compare_runs.csv``: one row per variant
and seed, ``final_loss`` in full precision; ``metrics.csv``: the ``moe_expert{i}_fraction``
columns, each expert's share of the top-2 assignments in that step's batch, averaged over the
layers; ``comparison.csv``: tlab's verdicts against dense) and writes:

    moe_utilisation.csv   per MoE variant and seed, and per variant (mean with its 95% t-interval
                          over seeds): the expert shares averaged over the last ``TAIL`` of the
                          logged training steps -> ``min_share``, ``max_share``, ``max_min_ratio``,
                          ``cv`` (std / mean over the experts; 0 = uniform) and ``eff_experts``
                          (exp of the shares' entropy; 8 = uniform, 1 = one expert)
    moe_contrasts.csv     paired by seed (``transformer_lab.measures.statistics``: 95% CI,
                          sign-flip p, Holm over all rows): with vs without the load-balancing
                          loss (``ffn.load_balance_coef`` 0.01 vs 0) at each size, in held-out
                          ``final_loss`` and in ``cv``; with ``--control``, sparse top-2
                          (``moe_total_lb``) vs the soft mixture of all experts (``moe_soft``)
    moe.png               (a) held-out loss minus dense's, per variant, 95% CI (comparison.csv;
                          ``--control``: the variants of a second run against its own dense);
                          (b) the largest and smallest expert share over training (mean over
                          seeds); (c) with ``--depth`` (a ``tlab reverse-task`` sweep over ``ffn``
                          and ``seed`` with its ``tlab report``): held-out loss over steps per run
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from transformer_lab.measures.statistics import holm, mean_interval, paired_comparison, verdict

OUT_DIR = Path(__file__).resolve().parents[1]
TAIL = 0.1  # the last 10% of the logged training steps
PAIRS = [("moe_active_lb", "moe_active_nolb"), ("moe_total_lb", "moe_total_nolb")]


def expert_shares(metrics: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Training rows of the MoE variants and the names of the share columns."""
    columns = sorted((c for c in metrics.columns if c.startswith("moe_expert")),
                     key=lambda c: int(c.removeprefix("moe_expert").split("_")[0]))
    rows = metrics[(metrics["split"] == "train") & metrics[columns[0]].notna()]
    return rows, columns


def spread(shares: np.ndarray) -> dict[str, float]:
    """Spread of one share vector (E,) that sums to 1."""
    positive = shares[shares > 0]
    return {"min_share": float(shares.min()), "max_share": float(shares.max()),
            "max_min_ratio": float(shares.max() / shares.min()) if shares.min() > 0 else math.inf,
            "cv": float(shares.std() / shares.mean()),
            "eff_experts": float(np.exp(-(positive * np.log(positive)).sum()))}


def utilisation(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, seed): the spread of the shares averaged over the last ``TAIL`` steps."""
    rows, columns = expert_shares(metrics)
    table = []
    for (variant, seed), runs in rows.groupby(["variant", "seed"], sort=False):
        last = runs["step"].max()
        tail = runs[runs["step"] > last * (1 - TAIL)]
        shares = tail[columns].to_numpy(dtype=float).mean(axis=0)  # (E,)
        table.append({"variant": variant, "seed": int(seed), "steps_averaged": len(tail),
                      **spread(shares / shares.sum()),
                      **{f"share{i}": s for i, s in enumerate(shares)}})
    return pd.DataFrame(table)


def summarise(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per variant: mean and 95% t-interval over seeds of each spread number."""
    numbers = ["min_share", "max_share", "max_min_ratio", "cv", "eff_experts"]
    table = []
    for variant, runs in per_seed.groupby("variant", sort=False):
        row: dict = {"variant": variant, "seed": "mean", "steps_averaged":
                     int(runs["steps_averaged"].iloc[0])}
        for number in numbers:
            interval = mean_interval(runs[number].to_numpy())
            row |= {number: interval.mean, f"{number}_ci_low": interval.low,
                    f"{number}_ci_high": interval.high}
        table.append(row)
    return pd.DataFrame(table)


def paired_test(wide: pd.DataFrame, metric: str, variant: str, baseline: str) -> dict:
    """``variant`` minus ``baseline`` on ``metric``, paired by seed (``wide``: seeds x names)."""
    pair = paired_comparison(wide[variant].to_numpy(), wide[baseline].to_numpy())
    return {"metric": metric, "variant": variant, "baseline": baseline, "diff": pair.diff,
            "diff_ci_low": pair.low, "diff_ci_high": pair.high, "p_value": pair.p_value,
            "paired_seeds": pair.n}


def contrasts(runs: pd.DataFrame, per_seed: pd.DataFrame,
              control: pd.DataFrame | None = None) -> pd.DataFrame:
    """With minus without the load-balancing loss (and, with ``control``'s runs, sparse minus
    soft mixture), paired by seed, Holm over all tests."""
    tests = []
    if control is not None:
        both = pd.concat([runs, control[control["activation"] == "moe_soft"]])
        wide = both.pivot(index="seed", columns="activation", values="final_loss")
        tests.append(paired_test(wide, "final_loss", "moe_total_lb", "moe_soft"))
    for with_lb, without in PAIRS:
        for metric, frame, key in (("final_loss", runs, "activation"), ("cv", per_seed,
                                                                       "variant")):
            wide = frame.pivot(index="seed", columns=key, values=metric)
            if with_lb not in wide or without not in wide:
                continue
            tests.append(paired_test(wide, metric, with_lb, without))
    table = pd.DataFrame(tests)
    table["p_adjusted"] = holm(table["p_value"].to_numpy())
    table["verdict"] = [verdict(d, p) for d, p in zip(table["diff"], table["p_adjusted"],
                                                      strict=True)]
    return table


def depth_curves(depth: Path) -> pd.DataFrame:
    """Held-out loss over steps of every run of a ``tlab report``-ed reverse-task sweep."""
    report = pd.read_csv(depth / "report.csv")
    curves = []
    for _, run in report.iterrows():
        metrics = pd.read_csv(depth / str(run["run_dir"]) / "metrics.csv")  # relative to DIR
        val = metrics[metrics["split"] == "val"]
        curves.append(pd.DataFrame({"ffn": run["ffn"], "seed": run["seed"],
                                    "step": val["step"], "loss": val["loss"]}))
    return pd.concat(curves)


def plot(comparison: pd.DataFrame, metrics: pd.DataFrame, curves: pd.DataFrame | None,
         path: Path) -> Path:
    from transformer_lab.results.plots import distinct_styles, plt, save

    panels = 3 if curves is not None else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.2 * panels, 4.2))
    others = comparison[comparison["verdict"] != "baseline"]
    y = np.arange(len(others))
    diff = others["diff_vs_baseline"].to_numpy(dtype=float)
    errors = [diff - others["diff_ci_low"].to_numpy(dtype=float),
              others["diff_ci_high"].to_numpy(dtype=float) - diff]
    axes[0].errorbar(diff, y, xerr=errors, fmt="o", capsize=4)
    axes[0].axvline(0.0, color="grey", linewidth=1)
    axes[0].set_yticks(y, others["activation"])
    axes[0].set_xlabel("held-out loss minus dense GELU (nats/char), 95% CI")
    axes[0].set_title("(a) MoE vs dense, paired by seed")
    rows, columns = expert_shares(metrics)
    variants = list(dict.fromkeys(rows["variant"]))
    for variant, style in zip(variants, distinct_styles(len(variants)), strict=True):
        runs = rows[rows["variant"] == variant]
        shares = runs[columns].to_numpy(dtype=float)
        frame = pd.DataFrame({"step": runs["step"].to_numpy(), "max": shares.max(axis=1),
                              "min": shares.min(axis=1)})
        by_step = frame.groupby("step").mean().rolling(10, min_periods=1).mean()
        axes[1].plot(by_step.index, by_step["max"], label=f"{variant} max", **style)
        axes[1].plot(by_step.index, by_step["min"], color=style["color"], linestyle=":")
    axes[1].axhline(1 / len(columns), color="grey", linewidth=1)
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("expert share (layer mean; dotted: min)")
    axes[1].set_title("(b) largest / smallest expert share")
    axes[1].set_ylim(0.0, 0.36)
    axes[1].legend(fontsize=7, loc="upper center", ncol=2)
    if curves is not None:
        for ffn, style in zip(curves["ffn"].unique(), distinct_styles(curves["ffn"].nunique()),
                              strict=True):
            for index, (_, run) in enumerate(curves[curves["ffn"] == ffn].groupby("seed")):
                axes[2].plot(run["step"], run["loss"], label=ffn if index == 0 else None,
                             alpha=0.8, **style)
        axes[2].set_xlabel("step")
        axes[2].set_ylabel("held-out loss (chance: ln 9 = 2.20)")
        axes[2].set_title("(c) reversal, 24 layers post-LN, lr 1e-2")
        axes[2].legend(fontsize=7)
    return save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the tlab compare-activations run directory")
    parser.add_argument("--depth", type=Path, default=None,
                        help="the reverse-task sweep directory (after tlab report)")
    parser.add_argument("--control", type=Path, default=None,
                        help="a second compare-activations run (the soft-mixture control): its "
                             "variants not in RUN are added to panel (a)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    metrics = pd.read_csv(args.run / "metrics.csv")
    runs = pd.read_csv(args.run / "compare_runs.csv")
    per_seed = utilisation(metrics)
    table = pd.concat([per_seed, summarise(per_seed)], ignore_index=True)
    table.to_csv(args.out_dir / "moe_utilisation.csv", index=False, float_format="%.6g")
    control = pd.read_csv(args.control / "compare_runs.csv") if args.control else None
    tests = contrasts(runs, per_seed, control)
    tests.to_csv(args.out_dir / "moe_contrasts.csv", index=False, float_format="%.6g")
    curves = depth_curves(args.depth) if args.depth is not None else None
    comparison = pd.read_csv(args.run / "comparison.csv")
    if args.control is not None:
        extra = pd.read_csv(args.control / "comparison.csv")
        comparison = pd.concat([comparison, extra[~extra["activation"].isin(
            comparison["activation"])]], ignore_index=True)
    plot(comparison, metrics, curves, args.out_dir / "moe.png")
    with pd.option_context("display.width", 160, "display.max_columns", 30):
        print(table[table["seed"] == "mean"].drop(columns=[c for c in table if
                                                           c.startswith("share")]))
        print(tests)


if __name__ == "__main__":
    main()
