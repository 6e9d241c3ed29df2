"""The headline table of experiments/norm_placement.md from ``tlab report``'s pivots.

    python -m experiments.scripts.norm_placement_table [REPORTS] [--out CSV]

``REPORTS`` (default ``outputs/norm_placement/reports``) holds the four reports the study's
commands write, each a ``report-pivot.csv`` with the verdict columns against ``block=pre``
(paired by seed, per depth; ``transformer_lab.results.verdicts``):

    depth_em/    the depth sweep (lr 5e-3), metric best_exact_match (higher is better)
    depth_loss/  the same sweep, metric final_loss (held-out, lower is better)
    highlr_em/   the 24-layer sweep at lr 1e-2, best_exact_match
    highlr_loss/ the same, final_loss

It writes one CSV row per (lr, n_layers, block) with both metrics' means, 95% CIs and verdicts,
the solved count and mean solved step, and the earlier 2-3-seed numbers of
``experiments/norm_placement.csv`` beside them (``old_*``); prints the markdown table; and draws
``--plot`` from the same pivots and the per-run ``report.csv`` files (no number is recomputed
except the plotted means, which are the pivots').
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

SWEEPS = {"depth": 5e-3, "highlr": 1e-2}  # sweep -> its learning rate
METRICS = {"em": "best_exact_match", "loss": "final_loss"}
VERDICT = ["diff_vs_baseline", "diff_ci_low", "diff_ci_high", "p_value", "p_adjusted", "verdict",
           "seeds_needed"]
OLD_CSV = Path("experiments/norm_placement.csv")


def metric_columns(pivot: pd.DataFrame, short: str) -> pd.DataFrame:
    """The pivot's keys, counts and one metric's columns, renamed ``<short>_<column>``."""
    metric = METRICS[short]
    keys = pd.DataFrame({"block": pivot["block"].astype(str),
                         "n_layers": pivot.get("model.n_layers", pd.Series(24, pivot.index))
                         .astype(int),
                         "seeds": pivot["seeds"], "runs": pivot["n_runs"],
                         "solved": pivot["n_passed"]})
    renamed = {f"{metric}_mean": "mean", f"{metric}_std": "std", f"{metric}_ci_low": "ci_low",
               f"{metric}_ci_high": "ci_high", **{c: c for c in VERDICT}}
    values = pivot[list(renamed)].rename(columns=renamed).add_prefix(f"{short}_")
    if short == "em":
        values["solved_step_mean"] = pivot["solved_step_mean"]
    return pd.concat([keys, values], axis=1)


def study_table(reports: Path) -> pd.DataFrame:
    """One row per (lr, n_layers, block), both metrics side by side."""
    parts = []
    for sweep, lr in SWEEPS.items():
        em, loss = (metric_columns(pd.read_csv(reports / f"{sweep}_{m}" / "report-pivot.csv"), m)
                    for m in METRICS)
        both = em.merge(loss.drop(columns=["seeds", "runs", "solved"]), on=["block", "n_layers"])
        parts.append(both.assign(lr=lr))
    table = pd.concat(parts, ignore_index=True)
    order = table["block"].map({"post": 0, "pre": 1, "deepnorm": 2})
    table = table.assign(order=order).sort_values(["lr", "n_layers", "order"]).drop(
        columns="order").reset_index(drop=True)
    return table[["lr", *[c for c in table.columns if c != "lr"]]]


def with_old(table: pd.DataFrame, old_csv: Path = OLD_CSV) -> pd.DataFrame:
    """The earlier study's numbers (``norm_placement.csv``, 2-3 seeds) beside the new ones."""
    old = pd.read_csv(old_csv)
    old = old[(old["study"] == "depth") & (old["schedule"] == "constant")]
    old = old.rename(columns={"norm": "block", "seeds": "old_seeds", "solved": "old_solved",
                              "best_em_mean": "old_em_mean", "best_em_std": "old_em_std",
                              "val_loss_mean": "old_loss_mean", "val_loss_std": "old_loss_std"})
    columns = ["block", "n_layers", "lr", "old_seeds", "old_solved", "old_em_mean", "old_em_std",
               "old_loss_mean", "old_loss_std"]
    return table.merge(old[columns], on=["block", "n_layers", "lr"], how="left")


def verdict_cell(row: pd.Series, short: str) -> str:
    """``+0.03 [0.01, 0.05] better (p_Holm 0.03)`` against pre-LN; ``baseline`` on its row."""
    if row[f"{short}_verdict"] == "baseline":
        return "baseline"
    return (f"{row[f'{short}_diff_vs_baseline']:+.3f} [{row[f'{short}_diff_ci_low']:+.3f}, "
            f"{row[f'{short}_diff_ci_high']:+.3f}], {row[f'{short}_verdict']} "
            f"(Holm p {row[f'{short}_p_adjusted']:.3f})")


def markdown(table: pd.DataFrame) -> str:
    """The study's headline table: new mean [95% CI] and verdicts, old mean ± std beside."""
    lines = ["| lr | layers | block | best exact match, mean [95% CI] (solved) | vs pre-LN "
             "(diff [95% CI], verdict) | held-out loss, mean [95% CI] | vs pre-LN | old "
             "(2-3 seeds): exact match (solved) |", "|" + "---|" * 8]
    for _, r in table.iterrows():
        old = (f"{r['old_em_mean']:.3f} ± {r['old_em_std']:.3f} "
               f"({int(r['old_solved'])}/{int(r['old_seeds'])})"
               if pd.notna(r["old_em_mean"]) else "-")
        lines.append(
            f"| {r['lr']:g} | {r['n_layers']} | {r['block']} | {r['em_mean']:.3f} "
            f"[{r['em_ci_low']:.3f}, {r['em_ci_high']:.3f}] ({r['solved']}/{r['runs']}) | "
            f"{verdict_cell(r, 'em')} | {r['loss_mean']:.3f} [{r['loss_ci_low']:.3f}, "
            f"{r['loss_ci_high']:.3f}] | {verdict_cell(r, 'loss')} | {old} |")
    return "\n".join(lines)


def plot(table: pd.DataFrame, reports: Path, path: Path) -> None:
    """(a) mean best exact match vs depth at lr 5e-3, 95% CI bars; (b) every seed at 24 layers,
    lr 5e-3 and 1e-2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    depth = table[table["lr"] == SWEEPS["depth"]]
    for offset, (block, rows) in zip((-0.08, 0.0, 0.08), depth.groupby("block", sort=False),
                                     strict=True):
        rows = rows.sort_values("n_layers")
        x = [i + offset for i in range(len(rows))]
        error = [rows["em_mean"] - rows["em_ci_low"], rows["em_ci_high"] - rows["em_mean"]]
        left.errorbar(x, rows["em_mean"], yerr=error, fmt="o-", capsize=3, label=block)
        left.set_xticks(range(len(rows)), [str(n) for n in rows["n_layers"]])
    left.set(xlabel="layers", ylabel="best held-out exact match",
             title="(a) lr 5e-3: mean and 95% CI over the seeds")
    left.legend()
    for column, sweep in enumerate(SWEEPS):
        runs = pd.read_csv(reports / f"{sweep}_em" / "report.csv")
        if "model.n_layers" in runs.columns:
            runs = runs[runs["model.n_layers"] == 24]
        for row, block in enumerate(("post", "pre", "deepnorm")):
            values = runs.loc[runs["block"] == block, "best_exact_match"]
            x = [3 * column + row + 0.05 * (k - len(values) / 2) for k in range(len(values))]
            right.scatter(x, values, color=f"C{row}", label=block if column == 0 else None)
    right.set_xticks([1, 4], ["lr 5e-3", "lr 1e-2"])
    right.set(ylabel="best held-out exact match", title="(b) 24 layers: every seed")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="?", type=Path,
                        default=Path("outputs/norm_placement/reports"))
    parser.add_argument("--out", type=Path, default=Path("experiments/norm_placement_seeds.csv"))
    parser.add_argument("--plot", type=Path, default=Path("experiments/norm_placement_seeds.png"))
    args = parser.parse_args()
    table = with_old(study_table(args.reports))
    table.to_csv(args.out, index=False, float_format="%.6g")
    plot(table, args.reports, args.plot)
    print(markdown(table))
    print(f"\nwrote {args.out}, {args.plot}")


if __name__ == "__main__":
    main()
