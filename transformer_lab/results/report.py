"""``tlab report DIR``: every run under a folder in one table, a pivot over the swept settings with
verdicts, and plots (``docs/cli.md``, "tlab report"); ``gather.py`` reads the runs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.table import Column, Table

from transformer_lab.errors import ConfigError
from transformer_lab.measures.statistics import variance_by_source
from transformer_lab.results.curve_metrics import CURVE_METRICS, curve_metric
from transformer_lab.results.gather import METRICS, SEED_SOURCES, Gathered, as_seed, gather
from transformer_lab.results.verdicts import verdict_columns, verdict_lines


@dataclass
class Report:
    gathered: Gathered
    pivot: pd.DataFrame
    metric: str | None
    files: list[Path]
    variance: pd.DataFrame | None = None  # report-variance.csv's rows, when there is one


def metrics_present(runs: pd.DataFrame) -> list[str]:
    return [m for m in (*METRICS, *CURVE_METRICS) if m in runs.columns and runs[m].notna().any()]


def with_curve_metrics(gathered: Gathered) -> Gathered:
    """``gathered`` with a ``CURVE_METRICS`` column: the mean over a run's curves (over a seed's,
    for a run counted per seed); NaN without a curve."""
    metrics, per_curve = list(CURVE_METRICS), []
    for (run_dir, _), curve in gathered.curves.sort_values("step").groupby(["run_dir", "curve"],
                                                                           sort=False):
        steps, losses = curve["step"].astype(int).tolist(), curve["loss"].tolist()
        per_curve.append({"run_dir": run_dir, "seed": curve["seed"].iloc[0],
                          **{metric: curve_metric(metric, steps, losses) for metric in metrics}})
    per_curve = pd.DataFrame(per_curve, columns=["run_dir", "seed", *metrics]).replace(
        [math.inf, -math.inf], math.nan)  # the mean of the finite values
    runs = gathered.runs
    seeds = pd.to_numeric(runs["seed"], errors="coerce") if "seed" in runs.columns else math.nan
    of_run = runs[["run_dir"]].join(per_curve.groupby("run_dir")[metrics].mean(), on="run_dir")
    of_seed = runs[["run_dir"]].assign(seed=seeds).join(
        per_curve.groupby(["run_dir", "seed"])[metrics].mean(), on=["run_dir", "seed"])
    values = of_run[metrics].mask(runs["run_dir"].isin(gathered.seeded), of_seed[metrics], axis=0)
    return dataclasses.replace(gathered, runs=runs.assign(**values))


def pivot_table(gathered: Gathered) -> pd.DataFrame:
    """One row per group of the swept keys (seed excluded): counts and mean/std of metrics."""
    keys, first = gathered.group_keys or ["group"], gathered.first_of_run()
    runs = gathered.runs if gathered.group_keys else gathered.runs.assign(group="all runs")
    runs = runs.assign(_first=first, _passed=first & (runs["status"] == "passed"),
                       **{key: runs[key].astype(str) for key in keys})
    seeds = {"seeds": ("seed", lambda s: ",".join(str(as_seed(v))
                                                  for v in sorted(s.dropna().unique())))}
    numbers = {f"{metric}_{name}": (metric, how) for metric in metrics_present(runs)
               for name, how in (("mean", "mean"), ("std", "std"), ("n", "count"))}
    # n_runs: run folders; n_seeds: samples (seeds); <metric>_n: the samples that have it
    return runs.groupby(keys, sort=False, dropna=False).agg(
        n_runs=("_first", "sum"), n_passed=("_passed", "sum"), n_seeds=("run_dir", "size"),
        **(seeds if "seed" in runs.columns else {}), **numbers).reset_index()


VARIANCE_COLUMNS = ["metric", "n_init", "n_data", "mean", "var_init", "var_data",
                    "var_residual", "var_total", "share_init", "share_data", "share_residual",
                    "note"]


def variance_table(gathered: Gathered, metric: str | None) -> pd.DataFrame | None:
    """Per group, ``metric``'s variance from ``seed_init``, ``seed_data`` and the residual, with
    shares; a ``note`` for a group that does not cross them; None unless both vary."""
    runs = gathered.runs
    if metric is None or not set(SEED_SOURCES) <= set(runs.columns) \
            or any(runs[k].dropna().astype(str).nunique() < 2 for k in SEED_SOURCES):
        return None
    keys = gathered.group_keys
    runs = runs.assign(**{k: runs[k].astype(str) for k in (*keys, *SEED_SOURCES)})
    rows = []
    for group, cells in runs.groupby(keys, sort=False) if keys else [((), runs)]:  # tuples
        row = {**dict(zip(keys, group, strict=True)), "metric": metric}
        rows.append(row)
        if cells.duplicated(list(SEED_SOURCES)).any():
            row["note"] = "a (seed_init, seed_data) pair appears twice: one run per pair"
            continue
        table = cells.pivot(index="seed_init", columns="seed_data", values=metric)
        try:  # (init seeds, data seeds); a pair no run has is NaN
            parts = variance_by_source(table.to_numpy(dtype=float))
        except ValueError as exc:
            row["note"] = f"{exc}: needs every seed_init x seed_data pair"
            continue
        below = [name for name, value in (("var_init", parts.init), ("var_data", parts.data))
                 if value < 0]
        row.update(zip(("share_init", "share_data", "share_residual"), parts.shares, strict=True),
                   n_init=parts.n_init, n_data=parts.n_data, mean=parts.mean,
                   var_init=parts.init, var_data=parts.data, var_residual=parts.residual,
                   var_total=parts.total, note=f"{' and '.join(below)} below 0 (within the "
                   "noise): 0 in the total and shares" if below else "")
    return pd.DataFrame(rows).reindex(columns=[*keys, *VARIANCE_COLUMNS])


def variance_lines(variance: pd.DataFrame, keys: list[str]) -> list[str]:
    """report.md's section for ``variance_table``'s rows."""
    metric = variance["metric"].iloc[0]
    header = [*keys, "seeds (init x data)", f"{metric} mean", "init", "data", "residual",
              "note"]
    body = []
    for _, row in variance.iterrows():
        if pd.isna(row["var_residual"]):
            numbers = ["–"] * 5
        else:
            numbers = [f"{int(row['n_init'])} x {int(row['n_data'])}", f"{row['mean']:.4g}"]
            numbers += [f"{row[f'var_{part}']:.3g} ({row[f'share_{part}']:.0%})"
                        for part in ("init", "data", "residual")]
        note = "" if pd.isna(row["note"]) else str(row["note"])
        body.append([*(str(row[k]) for k in keys), *numbers, note])
    return [f"## Variance by source ({metric} over seed_init x seed_data)", "",
            "Variance of one run from its initialisation seed, its data-order seed and the rest "
            "(their interaction and other noise; one run per pair cannot separate them), with "
            "each one's share: a two-way random-effects ANOVA, method of moments "
            "(`report-variance.csv`).", "", markdown_table(header, body), ""]


def mean_std(mean: float, std: float) -> str:
    if pd.isna(mean):
        return "–"
    return f"{mean:.4g}" if pd.isna(std) or std == 0 else f"{mean:.4g} ± {std:.2g}"


def display_rows(pivot: pd.DataFrame, keys: list[str], metrics: list[str]) -> tuple[list[str],
                                                                                   list[list[str]]]:
    seeds = ["seeds"] if "seeds" in pivot.columns else []
    verdict = ["verdict"] if "verdict" in pivot.columns else []
    body = []
    for _, row in pivot.iterrows():
        cells = [str(row[k]) for k in [*keys, "n_runs", "n_passed", *seeds]]
        for m in metrics:
            cells.append(mean_std(row[f"{m}_mean"], row[f"{m}_std"]))
            if 0 < row[f"{m}_n"] < row["n_seeds"]:  # e.g. solved_step of the seeds that solved
                cells[-1] += f" ({row[f'{m}_n']} of {row['n_seeds']})"
        body.append(cells + ["" if pd.isna(row[c]) else str(row[c]) for c in verdict])
    return [*keys, "runs", "passed", *seeds, *metrics, *verdict], body


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), "|" + "|".join("---" for _ in header) + "|", *map(line, body)])


def choose_metric(runs: pd.DataFrame, requested: str | None) -> str | None:
    present = metrics_present(runs)
    if requested is not None and requested not in present:
        curves = [] if requested in CURVE_METRICS else list(CURVE_METRICS)
        raise ConfigError(f"--metric {requested} has no values in these runs; available: "
                          f"{', '.join(present + curves) or 'none'}")
    return requested or next((m for m in ("best_exact_match", "final_loss") if m in present), None)


def free_prefix(out_dir: Path) -> str:
    """``report`` or the first ``report-<n>`` whose files do not exist yet."""
    for n in itertools.count(1):
        prefix = "report" if n == 1 else f"report-{n}"
        if not any((out_dir / f"{prefix}{suffix}").exists()
                   for suffix in (".csv", ".md", "-pivot.csv", "-loss.png", "-variance.csv")):
            return prefix


def _group_labels(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    """Per row of ``frame``: its group as ``key=value, ...`` (``all runs`` without keys)."""
    if not keys:
        return pd.Series("all runs", index=frame.index)
    return frame[keys].astype(str).apply(lambda row: ", ".join(f"{k}={v}" for k, v in row.items()),
                                         axis=1)


def plot_metric(pivot: pd.DataFrame, keys: list[str], metric: str, path: Path) -> Path:
    """One bar per group of ``pivot``: the mean of ``metric`` over its samples, std error bars."""
    from transformer_lab.results.plots import plt, save

    labels = _group_labels(pivot, keys).tolist()
    means = pivot[f"{metric}_mean"].to_numpy(dtype=float)
    stds = pivot[f"{metric}_std"].fillna(0.0).to_numpy(dtype=float)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * len(labels) + 2), 4))
    ax.bar(range(len(labels)), means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=30 if len(labels) > 3 else 0, ha="right"
                  if len(labels) > 3 else "center", fontsize=8)
    ax.set_ylabel(f"{metric} (mean ± std over seeds)")
    ax.set_title(f"{metric} at the end of each run, per choice")
    return save(fig, path)


def plot_loss_curves(gathered: Gathered, path: Path) -> Path | None:
    """Per group, the mean training loss at each step over every curve of its runs (each seed
    of a multi-seed run is one curve), std band; None without curves."""
    if gathered.curves.empty:
        return None
    from transformer_lab.results.plots import distinct_styles, plt, save

    first = gathered.runs.drop_duplicates("run_dir")
    label_of = _group_labels(first, gathered.group_keys).set_axis(first["run_dir"])
    curves = gathered.curves.assign(group=gathered.curves["run_dir"].map(label_of))
    groups = list(curves.groupby("group", sort=False))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (group, rows), style in zip(groups, distinct_styles(len(groups)), strict=True):
        by_step = rows.groupby("step")["loss"]
        mean, std = by_step.mean(), by_step.std(ddof=1).fillna(0.0)
        ax.plot(mean.index, mean.to_numpy(), label=str(group), **style)
        ax.fill_between(mean.index, (mean - std).to_numpy(), (mean + std).to_numpy(),
                        color=style["color"], alpha=0.2)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over seeds)")
    ax.set_title("loss curves per group")
    ax.legend(fontsize=7)
    return save(fig, path)


def make_report(root: Path, out_dir: Path | None = None, metric: str | None = None,
                baseline: str | None = None) -> Report:
    """Gather, summarise and write the report files; ``baseline`` as ``--baseline``."""
    gathered = gather(Path(root))
    if metric in CURVE_METRICS:  # asked for one: both, so report.csv has every number
        gathered = with_curve_metrics(gathered)
    chosen = choose_metric(gathered.runs, metric)
    pivot = pivot_table(gathered)
    if chosen is not None:
        pivot = verdict_columns(gathered, pivot, chosen, baseline)
    out_dir = Path(out_dir) if out_dir is not None else Path(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = free_prefix(out_dir)
    runs_csv, pivot_csv, variance_csv, md = (out_dir / f"{base}{suffix}" for suffix in
                                             (".csv", "-pivot.csv", "-variance.csv", ".md"))
    leading = [c for c in ["run_dir", "job", "status", *gathered.swept_keys]
               if c in gathered.runs.columns]
    gathered.runs[leading + [c for c in gathered.runs.columns if c not in leading]].to_csv(
        runs_csv, index=False)
    pivot.to_csv(pivot_csv, index=False)
    files = [runs_csv, pivot_csv]
    variance = variance_table(gathered, chosen)
    if variance is not None:
        variance.to_csv(variance_csv, index=False)
        files.append(variance_csv)
    if chosen is not None:
        files.append(plot_metric(pivot, gathered.group_keys, chosen,
                                 out_dir / f"{base}-{chosen}.png"))
    if (curve_png := plot_loss_curves(gathered, out_dir / f"{base}-loss.png")) is not None:
        files.append(curve_png)
    md.write_text(markdown_report(gathered, pivot, [f.name for f in files], chosen, variance))
    files.insert(2, md)
    return Report(gathered, pivot, chosen, files, variance)


def markdown_report(gathered: Gathered, pivot: pd.DataFrame, files: list[str],
                    metric: str | None, variance: pd.DataFrame | None) -> str:
    keys = gathered.group_keys or ["group"]
    header, body = display_rows(pivot, keys, metrics_present(gathered.runs))
    runs = gathered.runs[gathered.first_of_run()]  # one row per run folder
    counts = runs["status"].value_counts().to_dict()
    per_seed = (f" ({len(gathered.seeded)} of them trained several seeds: one sample per seed, "
                "from their seeds.csv)" if gathered.seeded else "")
    lines = [f"# Report: {gathered.root}", "",
             f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in counts.items())}){per_seed}; "
             f"grouped by {', '.join(gathered.group_keys) or 'nothing (one group)'}; "
             "mean ± std over seeds (sample std).", "", markdown_table(header, body), ""]
    if verdicts := verdict_lines(pivot, keys, metric or ""):
        lines += ["## Verdicts (paired by seed, 95% CI, Holm-adjusted p at 0.05)", "",
                  *(f"- {line}" for line in verdicts), ""]
    if variance is not None:
        lines += variance_lines(variance, gathered.group_keys)
    failed = runs[runs["status"] != "passed"]
    if not failed.empty:
        columns = ["run_dir", *(k for k in gathered.swept_keys if k in runs.columns), "status"]
        rows = [[str(r[c]) for c in columns] + ["" if pd.isna(r.get("error")) else str(r["error"])]
                for _, r in failed.iterrows()]
        lines += ["## Runs that did not pass", "", markdown_table([*columns, "error"], rows), ""]
    if gathered.skipped:
        lines += ["## Skipped files", "", *(f"- `{path}`: {why}" for path, why in gathered.skipped),
                  ""]
    if gathered.superseded:
        lines += [f"{gathered.superseded} superseded attempt(s) (`<job>.failed-<n>`, kept by "
                  "`--resume`) are not counted.", ""]
    lines += ["Files: " + ", ".join(f"`{name}`" for name in files), ""]
    return "\n".join(lines)


def rich_table(report: Report) -> Table:
    gathered = report.gathered
    header, body = display_rows(report.pivot, gathered.group_keys or ["group"],
                                metrics_present(gathered.runs))
    n_runs = int(gathered.first_of_run().sum())
    table = Table(*(Column(name, overflow="fold") for name in header),
                  title=f"tlab report - {gathered.root} ({n_runs} runs)")
    for row in body:
        table.add_row(*row)
    return table
