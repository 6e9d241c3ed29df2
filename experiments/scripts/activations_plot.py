"""The figure of experiments/activations.md: each activation against relu, paired by seed.

    python -m experiments.scripts.activations_plot METRICS_CSV [RUNS_CSV]
                                                   [--out experiments/activations.png]

(a) final held-out loss minus relu's (mean over seeds, 95% t-interval of the paired
differences, from ``compare_runs.csv``), next to Shazeer 2020 Table 1's log-perplexity minus
ReLU's after 65,536 and 524,288 steps (per subword token there, per character here: compare
signs and order, not sizes); (b) smoothed training loss (EMA 0.1, as tlab's loss curves) minus
relu's over the steps, mean over seeds with the 95% t-band, from the run's ``metrics.csv``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.scripts.activations_stats import SHAZEER
from transformer_lab.measures.statistics import mean_interval, paired_comparison

OUT = Path(__file__).resolve().parents[1] / "activations.png"
RUNS = Path(__file__).resolve().parents[1] / "activations_runs.csv"


def smoothed_curves(metrics_csv: Path) -> pd.DataFrame:
    """(step, activation, seed) -> EMA of the training loss, as a wide frame indexed by step."""
    from transformer_lab.routines.compare import SMOOTHING, ema

    metrics = pd.read_csv(metrics_csv)
    train = metrics[metrics["split"] == "train"].sort_values("step")
    curves = {key: pd.Series(ema(group["loss"].tolist(), SMOOTHING), index=group["step"])
              for key, group in train.groupby(["variant", "seed"], sort=False)}
    return pd.DataFrame(curves)  # columns: (activation, seed)


def plot(runs: pd.DataFrame, curves: pd.DataFrame, out: Path) -> Path:
    from transformer_lab.results.plots import plt, save

    names = [n for n in dict.fromkeys(runs["activation"]) if n != "relu"]
    wide = runs.pivot(index="seed", columns="activation", values="final_loss")  # (seeds, acts)
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(len(names))
    pairs = [paired_comparison(wide[n].to_numpy(), wide["relu"].to_numpy()) for n in names]
    left.errorbar(x, [p.diff for p in pairs],
                  yerr=[[p.diff - p.low for p in pairs], [p.high - p.diff for p in pairs]],
                  fmt="o", color="black", capsize=3, label=f"here, {len(wide)} seeds (95% CI)")
    for (column, paper), marker in zip(SHAZEER.items(), ("s", "^"), strict=True):
        shown = [(i, paper[n] - paper["relu"]) for i, n in enumerate(names) if n in paper]
        left.scatter([i + 0.2 for i, _ in shown], [d for _, d in shown], marker=marker,
                     label=f"Shazeer 2020, {column}")
    left.axhline(0, color="gray", lw=0.8)
    left.set_xticks(x, names, rotation=30)
    left.set_ylabel("final held-out loss - relu's (nats)")
    left.set_title("(a) final loss against relu, paired by seed")
    left.legend(fontsize=8)
    for name in names:
        diffs = curves[name].sub(curves["relu"])  # (steps, seeds)
        intervals = [mean_interval(row) for row in diffs.to_numpy()]
        (line,) = right.plot(diffs.index, [i.mean for i in intervals], label=name,
                             linestyle="--" if name == "gelu_tanh" else "-")  # gelu below it
        right.fill_between(diffs.index, [i.low for i in intervals], [i.high for i in intervals],
                           color=line.get_color(), alpha=0.15)
    right.axhline(0, color="gray", lw=0.8)
    right.set_xlabel("step")
    right.set_ylabel("training loss (EMA 0.1) - relu's (nats)")
    right.set_title("(b) training loss against relu over the steps")
    right.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    return save(figure, out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metrics_csv", type=Path)
    parser.add_argument("runs_csv", type=Path, nargs="?", default=RUNS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    print(f"wrote {plot(pd.read_csv(args.runs_csv), smoothed_curves(args.metrics_csv), args.out)}")


if __name__ == "__main__":
    main()
