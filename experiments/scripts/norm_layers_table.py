"""One table of the norm-layers study's verdicts from its ``tlab report`` folders
(experiments/norm_layers.md).

    python -m experiments.scripts.norm_layers_table runs/norm_layers_report \
        runs/norm_layers_b4_report --out experiments/norm_layers.csv

Each folder holds one ``tlab report --metric M --out FOLDER/M`` per metric; ``report-pivot.csv``
names its metric's columns after it (``early_loss_mean``, ``early_loss_ci_low``, ...). This
stacks them, one row per (folder, metric, group), under common names: ``mean``, ``std``
(sample, over seeds), ``ci_low``/``ci_high`` (95% t-interval of the mean) and the verdict
columns against the baseline group as ``tlab report`` computed them. No number is recomputed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

METRICS = ["final_loss", "early_loss", "late_loss_std", "tokens_per_s"]
VERDICT = ["baseline", "diff_vs_baseline", "diff_ci_low", "diff_ci_high", "p_value",
           "p_adjusted", "verdict", "seeds_needed", "paired_seeds"]


def with_keys(pivot: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """``pivot`` with a ``block`` and ``norm_layer`` column even where the sweep held one fixed
    (not a swept key, so not grouped): its value from report.csv (summary's ``norm`` is the
    block)."""
    for key, column in (("block", "norm"), ("norm_layer", "norm_layer")):
        if key not in pivot.columns:
            pivot[key] = "/".join(sorted(runs[column].astype(str).unique()))
    return pivot


def metric_rows(pivot: pd.DataFrame, metric: str, keys: list[str]) -> pd.DataFrame:
    """The pivot's rows for ``metric`` under the common column names."""
    renamed = {f"{metric}_{part}": part for part in ("mean", "std", "ci_low", "ci_high")}
    table = pivot.rename(columns=renamed)
    return table[[*keys, "seeds", *renamed.values(), *VERDICT]].assign(metric=metric)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="+")
    parser.add_argument("--out", type=Path, default=Path("experiments/norm_layers.csv"))
    args = parser.parse_args(argv)
    parts = []
    for folder in args.folders:
        for metric in METRICS:
            path = folder / metric / "report-pivot.csv"
            if path.exists():
                pivot = with_keys(pd.read_csv(path, dtype={"seeds": str}),
                                  pd.read_csv(path.parent / "report.csv"))
                rows = metric_rows(pivot, metric, ["block", "norm_layer"])
                parts.append(rows.assign(setting=folder.name))
    table = pd.concat(parts, ignore_index=True)
    first = ["setting", "metric", "block", "norm_layer"]
    table = table[first + [c for c in table.columns if c not in first]]
    table.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(table)} rows")


if __name__ == "__main__":
    main()
