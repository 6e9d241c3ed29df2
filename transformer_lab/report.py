"""``tlab report DIR``: gather every run under a folder (a sweep, or any folder of runs) into one
table, a pivot over the swept settings, and plots.

A run is a folder holding ``run.json``, ``summary.csv`` or ``metrics.csv`` (``results.py``). For
each run the report reads ``summary.csv`` (one row per run: choices, sizes, numbers, status),
``run.json`` (the status of a run that has not finished: partial sweeps work) and Hydra's
``.hydra/overrides.yaml`` + ``.hydra/hydra.yaml`` (the overrides and group choices it ran with).

Swept keys are the override keys whose value differs between runs (a group key such as ``pe``
takes the group's choice, a value key such as ``model.n_heads`` the resolved config value, so a
run that left a key at its default still gets a value). The pivot groups the runs by the swept
keys other than ``seed`` and gives, per group, the number of runs, how many passed and
``mean ± std`` over the seeds of each summary number (sample std, ddof=1).

Files (into DIR or ``--out``; an earlier report is never overwritten: the first report is
``report.*``, later ones ``report-2.*``, ``report-3.*``, ...):

    report.csv              one row per run: run_dir, job, status, swept keys, summary columns
    report-pivot.csv        the pivot as numbers (<metric>_mean, <metric>_std, n_runs, n_passed)
    report.md               the pivot as a markdown table, plus failed and skipped runs
    report-<metric>.png     the final metric per group (mean, std error bars)
    report-loss.png         training-loss curves, one line per group (mean over seeds, std band)

Runs moved aside by ``--resume`` (``<job>.failed-<n>``) are superseded attempts: not gathered.
A run whose ``summary.csv`` cannot be parsed is skipped and named; an unreadable ``metrics.csv``
only drops that run's loss curve.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from transformer_lab.errors import ConfigError
from transformer_lab.results import holds_run
from transformer_lab.sweeps import is_failed_attempt_dir

# Summary numbers summarised over seeds (a column absent from every run is left out).
METRICS = ["final_loss", "best_exact_match", "solved_step", "steps", "params", "wall_s",
           "tokens_per_s"]
# Summary columns that describe a run's configuration (used when runs carry no Hydra overrides).
SETTING_COLUMNS = ["routine", "arch", "pe", "norm", "norm_layer", "activation", "d_model",
                   "n_heads", "n_layers", "d_ff", "seq_len", "vocab_size"]
_NOT_GROUPED = {"seed"}
_SKIPPED_DIRS = {".hydra", ".submitit", "__pycache__"}
_CSV_ERRORS = (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError,
               OSError)


@dataclass
class Gathered:
    """The runs under a folder, ready to summarise."""

    root: Path
    runs: pd.DataFrame                     # one row per run (and per summary.csv row)
    curves: pd.DataFrame                   # run_dir, step, loss: the training-loss rows
    group_keys: list[str]                  # swept keys the pivot groups by (seed excluded)
    swept_keys: list[str]                  # every key that varies, seed included
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # unreadable files, why
    superseded: int = 0                    # <job>.failed-<n> folders left out


@dataclass
class Report:
    gathered: Gathered
    pivot: pd.DataFrame
    metric: str | None
    files: list[Path]


# --- gathering ------------------------------------------------------------------------------

def find_run_dirs(root: Path) -> tuple[list[Path], int]:
    """Run folders under ``root`` (``root`` itself included) and the count of superseded ones.

    The walk does not go into a run folder, Hydra's own folders or ``<job>.failed-<n>``."""
    runs, superseded = [], 0
    for current, dirs, _files in os.walk(root):
        path = Path(current)
        if holds_run(path):
            runs.append(path)
            dirs[:] = []
            continue
        kept = []
        for name in sorted(dirs):
            if name in _SKIPPED_DIRS:
                continue
            if is_failed_attempt_dir(path / name):
                superseded += 1
                continue
            kept.append(name)
        dirs[:] = kept
    return sorted(runs, key=_natural_key), superseded


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in path.parts]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _load_yaml(path: Path) -> Any:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path) if path.exists() else None
    except Exception:
        return None


def hydra_settings(run_dir: Path) -> tuple[dict[str, str], dict[str, Any]]:
    """(task overrides as key -> raw value, group choices and job number) from ``.hydra``."""
    overrides: dict[str, str] = {}
    listed = _load_yaml(run_dir / ".hydra" / "overrides.yaml")
    for item in listed or []:
        key, _, value = str(item).partition("=")
        overrides[key.lstrip("+~")] = value
    hydra_cfg = _load_yaml(run_dir / ".hydra" / "hydra.yaml")
    extra: dict[str, Any] = {}
    if hydra_cfg is not None:
        from omegaconf import OmegaConf

        choices = OmegaConf.select(hydra_cfg, "hydra.runtime.choices")
        extra["choices"] = {str(k): v for k, v in (choices or {}).items()}
        extra["job"] = OmegaConf.select(hydra_cfg, "hydra.job.num", default=None)
    return overrides, extra


def _config_value(run_dir: Path, key: str, cache: dict[Path, Any]) -> Any:
    from omegaconf import OmegaConf

    if run_dir not in cache:
        cache[run_dir] = _load_yaml(run_dir / "config.yaml")
    cfg = cache[run_dir]
    if cfg is None:
        return None
    try:
        value = OmegaConf.select(cfg, key, default=None)
    except Exception:
        return None
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def read_summary(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``summary.csv`` (raises a ``_CSV_ERRORS`` member if the file is corrupt), or a
    row made from ``run.json`` for a run that has not written its summary yet."""
    path = run_dir / "summary.csv"
    info = _read_json(run_dir / "run.json")
    if path.exists():
        table = pd.read_csv(path)
        if table.empty:
            raise ValueError("no rows")
        if "status" not in table.columns:
            raise ValueError("no 'status' column")
        return table.to_dict("records")
    return [{"status": info.get("status", "unknown"), "seed": info.get("seed"),
             "routine": info.get("routine"), "error": info.get("error")}]


def read_curve(run_dir: Path) -> pd.DataFrame | None:
    """Training-loss rows (step, loss) of ``metrics.csv``; ``None`` if absent."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return None
    table = pd.read_csv(path)
    if not {"step", "loss"} <= set(table.columns):
        raise ValueError("no 'step'/'loss' columns")
    if "split" in table.columns:
        table = table[table["split"] == "train"]
    table = table.assign(step=pd.to_numeric(table["step"], errors="coerce"),
                         loss=pd.to_numeric(table["loss"], errors="coerce"))
    return table[["step", "loss"]].dropna()


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}"[:160] if text else type(exc).__name__


def gather(root: Path) -> Gathered:
    """Read every run under ``root``. Raises ``ConfigError`` if there is none to read."""
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"'{root}' is not a directory; give a sweep or a folder of runs")
    run_dirs, superseded = find_run_dirs(root)
    if not run_dirs:
        raise ConfigError(f"no runs under '{root}' (a run is a folder with run.json, "
                          "summary.csv or metrics.csv)")
    rows: list[dict[str, Any]] = []
    curves: list[pd.DataFrame] = []
    skipped: list[tuple[Path, str]] = []
    overrides_by_run: dict[str, dict[str, str]] = {}
    choices_by_run: dict[str, dict[str, Any]] = {}
    for run_dir in run_dirs:
        name = str(run_dir.relative_to(root)) if run_dir != root else "."
        try:
            summary_rows = read_summary(run_dir)
        except _CSV_ERRORS as exc:
            skipped.append((run_dir / "summary.csv", _reason(exc)))
            continue
        try:
            curve = read_curve(run_dir)
            if curve is not None and not curve.empty:
                curves.append(curve.assign(run_dir=name))
        except _CSV_ERRORS as exc:
            skipped.append((run_dir / "metrics.csv", _reason(exc) + " (loss curve left out)"))
        overrides, extra = hydra_settings(run_dir)
        overrides_by_run[name] = overrides
        choices_by_run[name] = extra.get("choices", {})
        info = _read_json(run_dir / "run.json")
        for summary in summary_rows:
            row = {"run_dir": name, "job": extra.get("job"), **summary}
            if pd.isna(row.get("status")):
                row["status"] = info.get("status", "unknown")
            rows.append(row)
    if not rows:
        raise ConfigError(f"no readable runs under '{root}': "
                          + "; ".join(f"{p}: {why}" for p, why in skipped))
    runs = pd.DataFrame(rows)
    swept = _swept_keys(root, runs, overrides_by_run, choices_by_run)
    for key, values in swept.items():
        runs[key] = runs["run_dir"].map(values)
    for metric in METRICS:
        if metric in runs.columns:
            runs[metric] = pd.to_numeric(runs[metric], errors="coerce")
    curve_table = (pd.concat(curves, ignore_index=True) if curves
                   else pd.DataFrame(columns=["step", "loss", "run_dir"]))
    group_keys = [k for k in swept if k not in _NOT_GROUPED]
    return Gathered(root, runs, curve_table, group_keys, list(swept), skipped, superseded)


def _swept_keys(root: Path, runs: pd.DataFrame, overrides_by_run: dict[str, dict[str, str]],
                choices_by_run: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """key -> {run_dir: value} for every key whose value differs between runs."""
    config_cache: dict[Path, Any] = {}
    keys = sorted({k for overrides in overrides_by_run.values() for k in overrides},
                  key=lambda k: (k == "seed", k))
    swept: dict[str, dict[str, Any]] = {}
    for key in keys:
        values: dict[str, Any] = {}
        for name, overrides in overrides_by_run.items():
            run_dir = root / name
            if key in choices_by_run[name]:
                value = choices_by_run[name][key]
            else:
                value = _config_value(run_dir, key, config_cache)
                if value is None:
                    value = overrides.get(key)
            values[name] = value
        if len({str(v) for v in values.values()}) > 1:
            swept[key] = values
    if not [k for k in swept if k not in _NOT_GROUPED]:  # no Hydra overrides tell: use choices
        for column in SETTING_COLUMNS:
            if column in runs.columns and runs[column].astype(str).nunique() > 1:
                swept[column] = dict(zip(runs["run_dir"], runs[column], strict=False))
    return swept


# --- summarising ----------------------------------------------------------------------------

def metrics_present(runs: pd.DataFrame) -> list[str]:
    return [m for m in METRICS if m in runs.columns and runs[m].notna().any()]


def pivot_table(gathered: Gathered) -> pd.DataFrame:
    """One row per group of the swept keys (seed excluded): counts and mean/std of metrics."""
    runs = gathered.runs.copy()
    keys = gathered.group_keys
    if not keys:
        runs["group"] = "all runs"
        keys = ["group"]
    for key in keys:
        runs[key] = runs[key].astype(str)
    metrics = metrics_present(runs)
    grouped = runs.groupby(keys, sort=False, dropna=False)
    table = grouped.agg(n_runs=("run_dir", "size"),
                        n_passed=("status", lambda s: int((s == "passed").sum())))
    if "seed" in runs.columns:
        table["seeds"] = grouped["seed"].agg(
            lambda s: ",".join(str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
                               for v in sorted(s.dropna().unique())))
    for metric in metrics:
        table[f"{metric}_mean"] = grouped[metric].mean()
        table[f"{metric}_std"] = grouped[metric].std(ddof=1)
        table[f"{metric}_n"] = grouped[metric].count()  # runs that have it (e.g. solved ones)
    return table.reset_index()


def mean_std(mean: float, std: float) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if std is None or (isinstance(std, float) and math.isnan(std)) or std == 0:
        return f"{mean:.4g}"
    return f"{mean:.4g} ± {std:.2g}"


def display_rows(pivot: pd.DataFrame, keys: list[str], metrics: list[str]) -> tuple[list[str],
                                                                                   list[list[str]]]:
    header = [*keys, "runs", "passed", *(["seeds"] if "seeds" in pivot.columns else []),
              *metrics]
    body = []
    for _, row in pivot.iterrows():
        cells = [str(row[k]) for k in keys] + [str(row["n_runs"]), str(row["n_passed"])]
        if "seeds" in pivot.columns:
            cells.append(str(row["seeds"]))
        for m in metrics:
            cell = mean_std(row[f"{m}_mean"], row[f"{m}_std"])
            if 0 < row[f"{m}_n"] < row["n_runs"]:  # e.g. solved_step of the seeds that solved
                cell += f" ({row[f'{m}_n']} of {row['n_runs']})"
            cells.append(cell)
        body.append(cells)
    return header, body


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def choose_metric(runs: pd.DataFrame, requested: str | None) -> str | None:
    present = metrics_present(runs)
    if requested is not None:
        if requested not in present:
            raise ConfigError(f"--metric {requested} has no values in these runs; available: "
                              f"{', '.join(present) or 'none'}")
        return requested
    return next((m for m in ("best_exact_match", "final_loss") if m in present), None)


def free_prefix(out_dir: Path) -> str:
    """``report`` or the first ``report-<n>`` whose files do not exist yet."""
    n = 1
    while True:
        prefix = "report" if n == 1 else f"report-{n}"
        if not any((out_dir / f"{prefix}{suffix}").exists()
                   for suffix in (".csv", ".md", "-pivot.csv", "-loss.png")):
            return prefix
        n += 1


# --- plots ----------------------------------------------------------------------------------

def _group_labels(frame: pd.DataFrame, keys: list[str]) -> pd.Series:
    if not keys:
        return pd.Series(["all runs"] * len(frame), index=frame.index)
    return frame[keys].astype(str).apply(
        lambda row: ", ".join(f"{k}={v}" for k, v in zip(keys, row, strict=False)), axis=1)


def plot_metric(pivot: pd.DataFrame, keys: list[str], metric: str, path: Path) -> Path:
    from transformer_lab.plots import plt, save

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
    if gathered.curves.empty:
        return None
    from transformer_lab.plots import distinct_styles, plt, save

    labels = _group_labels(gathered.runs.drop_duplicates("run_dir"), gathered.group_keys)
    label_of = dict(zip(gathered.runs.drop_duplicates("run_dir")["run_dir"], labels,
                        strict=False))
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


# --- the report -----------------------------------------------------------------------------

def make_report(root: Path, out_dir: Path | None = None, metric: str | None = None) -> Report:
    """Gather, summarise and write the report files; return what was written."""
    gathered = gather(Path(root))
    chosen = choose_metric(gathered.runs, metric)
    pivot = pivot_table(gathered)
    out_dir = Path(out_dir) if out_dir is not None else Path(root)
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = free_prefix(out_dir)
    files = []
    leading = ["run_dir", "job", "status", *gathered.swept_keys]
    columns = [c for c in leading if c in gathered.runs.columns]
    columns += [c for c in gathered.runs.columns if c not in columns]
    runs_csv = out_dir / f"{prefix}.csv"
    gathered.runs[columns].to_csv(runs_csv, index=False)
    pivot_csv = out_dir / f"{prefix}-pivot.csv"
    pivot.to_csv(pivot_csv, index=False)
    files += [runs_csv, pivot_csv]
    keys = gathered.group_keys or ["group"]
    if chosen is not None:
        files.append(plot_metric(pivot, gathered.group_keys, chosen,
                                 out_dir / f"{prefix}-{chosen}.png"))
    curve_png = plot_loss_curves(gathered, out_dir / f"{prefix}-loss.png")
    if curve_png is not None:
        files.append(curve_png)
    md = out_dir / f"{prefix}.md"
    md.write_text(markdown_report(gathered, pivot, keys, [f.name for f in files]))
    files.insert(2, md)
    return Report(gathered, pivot, chosen, files)


def markdown_report(gathered: Gathered, pivot: pd.DataFrame, keys: list[str],
                    files: list[str]) -> str:
    runs = gathered.runs
    header, body = display_rows(pivot, keys, metrics_present(runs))
    counts = runs["status"].value_counts().to_dict()
    lines = [f"# Report: {gathered.root}", "",
             f"{len(runs)} runs ({', '.join(f'{n} {s}' for s, n in counts.items())}); "
             f"grouped by {', '.join(gathered.group_keys) or 'nothing (one group)'}; "
             "mean ± std over seeds (sample std).", "", markdown_table(header, body), ""]
    failed = runs[runs["status"] != "passed"]
    if not failed.empty:
        keys = [k for k in gathered.swept_keys if k in runs.columns]
        lines += ["## Runs that did not pass", "",
                  markdown_table(["run_dir", *keys, "status", "error"],
                                 [[str(r["run_dir"]), *(str(r[k]) for k in keys),
                                   str(r["status"]),
                                   "" if pd.isna(r.get("error")) else str(r.get("error"))]
                                  for _, r in failed.iterrows()]), ""]
    if gathered.skipped:
        lines += ["## Skipped files", ""]
        lines += [f"- `{path}`: {why}" for path, why in gathered.skipped]
        lines.append("")
    if gathered.superseded:
        lines += [f"{gathered.superseded} superseded attempt(s) (`<job>.failed-<n>`, kept by "
                  "`--resume`) are not counted.", ""]
    lines += ["Files: " + ", ".join(f"`{name}`" for name in files), ""]
    return "\n".join(lines)


def rich_table(report: Report):
    from rich.table import Table

    gathered = report.gathered
    keys = gathered.group_keys or ["group"]
    header, body = display_rows(report.pivot, keys, metrics_present(gathered.runs))
    table = Table(title=f"tlab report - {gathered.root} ({len(gathered.runs)} runs)")
    for column in header:
        table.add_column(column, overflow="fold")
    for row in body:
        table.add_row(*row)
    return table
