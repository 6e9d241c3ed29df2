"""Read the runs under a folder for ``tlab report``: which folders are runs, their summaries,
loss curves, statuses and overrides, a row per seed of ``seeds.csv``, and the swept keys."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from transformer_lab.errors import ConfigError
from transformer_lab.results.run_directory import (
    SETTING_COLUMNS,
    holds_run,
    is_failed_attempt_dir,
    read_json,
)

# The summary numbers (run_directory.NUMBER_COLUMNS) summarised over seeds, in the report's column
# order; a column absent from every run is left out.
METRICS = ["final_loss", "best_exact_match", "solved_step", "steps", "params", "wall_s",
           "tokens_per_s"]
# The seeds a run may set apart from ``seed`` (which sets both): initial weights, data order.
SEED_SOURCES = ("seed_init", "seed_data")
# Never grouped by: a seed is a sample, and so is a seed trained with ``--seeds N``.
_NOT_GROUPED = {"seed", "routine.seeds", *SEED_SOURCES}
_SKIPPED_DIRS = {".hydra", ".submitit", "__pycache__"}
NOPE = "none"  # the NoPE control's ``variant`` in metrics.csv (``routines.reverse_task.NOPE``)
# The ``stage`` of reversal rows in metrics.csv (``routines.reverse_task.STAGE``; runs of tlab
# 0.2 and earlier wrote ``reverse``).
REVERSAL_STAGES = ("reverse_task", "reverse")
_CSV_ERRORS = (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, ValueError,
               OSError)


@dataclass
class Gathered:
    """The runs under a folder, ready to summarise."""

    root: Path
    runs: pd.DataFrame                     # one row per run (per seed of seeds.csv)
    curves: pd.DataFrame                   # run_dir, curve, seed, step, loss: training loss
    group_keys: list[str]                  # swept keys the pivot groups by (seed excluded)
    swept_keys: list[str]                  # every key that varies, seed included
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # unreadable files, why
    superseded: int = 0                    # <job>.failed-<n> folders left out
    seeded: set[str] = field(default_factory=set)  # run_dirs counted per seed (seeds.csv)

    def first_of_run(self) -> pd.Series:
        """Per row of ``runs``: False for the 2nd, 3rd, ... seed of a run counted per seed
        (``seeds.csv``), so that counting True rows counts run folders."""
        return ~(self.runs["run_dir"].isin(self.seeded) & self.runs["run_dir"].duplicated())


def find_run_dirs(root: Path) -> tuple[list[Path], int]:
    """Run folders under ``root`` (itself included) and the count of ``<job>.failed-<n>``."""
    runs, superseded = [], 0
    for current, dirs, _files in os.walk(root):
        path = Path(current)
        if holds_run(path):
            runs.append(path)
            dirs[:] = []
            continue
        failed = [name for name in dirs if is_failed_attempt_dir(path / name)]
        superseded += len(failed)
        dirs[:] = sorted(set(dirs) - _SKIPPED_DIRS - set(failed))
    return sorted(runs, key=lambda p: [int(part) if part.isdigit() else part
                                       for part in p.parts]), superseded


def _load_yaml(path: Path) -> Any:
    """A run's YAML file as plain data (nothing resolved or imported); None if unreadable."""
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(OmegaConf.load(path)) if path.exists() else None
    except Exception:
        return None


def _select(node: Any, key: str) -> Any:
    """``a.b.c`` of nested dicts, None if absent (``OmegaConf.select`` on plain data)."""
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def hydra_settings(run_dir: Path) -> tuple[dict[str, str], dict[str, Any], Any]:
    """(task overrides as key -> raw value, group choices, job number) from ``.hydra``."""
    listed = _load_yaml(run_dir / ".hydra" / "overrides.yaml") or []
    overrides = {key.lstrip("+~"): value
                 for key, _, value in (str(item).partition("=") for item in listed)}
    hydra_cfg = _load_yaml(run_dir / ".hydra" / "hydra.yaml")
    choices = _select(hydra_cfg, "hydra.runtime.choices")
    return (overrides, {str(k): v for k, v in choices.items()} if isinstance(choices, dict)
            else {}, _select(hydra_cfg, "hydra.job.num"))


def _config_value(config: Any, key: str) -> Any:
    value = _select(config, key)
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def read_summary(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``summary.csv``, or one from ``run.json`` for a run without it yet."""
    path = run_dir / "summary.csv"
    if path.exists():
        table = pd.read_csv(path)
        if table.empty or "status" not in table.columns:
            raise ValueError("no rows" if table.empty else "no 'status' column")
        return table.to_dict("records")
    info = read_json(run_dir / "run.json")
    return [{"status": info.get("status", "unknown"), "seed": info.get("seed"),
             "routine": info.get("routine"), "error": info.get("error")}]


def read_seeds(run_dir: Path) -> list[dict[str, Any]]:
    """Rows of ``seeds.csv`` (one per seed of a ``--seeds N`` run); ``[]`` under 2 rows."""
    path = run_dir / "seeds.csv"
    if not path.exists():
        return []
    table = pd.read_csv(path)
    seeds = table.get("seed")
    if seeds is None or seeds.isna().any() or seeds.duplicated().any():
        raise ValueError("no 'seed' column" if seeds is None else "a seed missing or twice")
    return table.to_dict("records") if len(table) > 1 else []


def read_curve(run_dir: Path, own_variant: str | None = None) -> pd.DataFrame | None:
    """Training-loss rows (step, loss, curve, seed) of ``metrics.csv``, None if absent;
    ``curve``: the row's ``stage/variant/seed`` tags. Beside a NoPE control only the rows of
    ``own_variant`` (the run's PE), of its reversal stage."""
    path = run_dir / "metrics.csv"
    if not path.exists():
        return None
    table = pd.read_csv(path)
    if not {"step", "loss"} <= set(table.columns):
        raise ValueError("no 'step'/'loss' columns")
    if "split" in table.columns:
        table = table[table["split"] == "train"]
    if own_variant is not None and "variant" in table.columns:
        variants = table["variant"].astype(str)
        own = variants == own_variant
        if not own.any() and (variants == NOPE).any():  # tagged by its table label (alibi(abs),
            own = variants != NOPE  # a user's PE's class name): all but the NoPE control
        if own.any():
            table = table[own]
    if "stage" in table.columns and table["stage"].nunique() > 1 \
            and (reversal := table["stage"].isin(REVERSAL_STAGES)).any():
        table = table[reversal]
    tags = [c for c in ("stage", "variant", "seed") if c in table.columns]
    # joined per row (agg("/".join, axis=1) is far slower); an empty tag as "" (pandas 3 keeps
    # a missing value missing through astype(str))
    parts = table[tags].astype(object).fillna("").astype(str)
    curve = (pd.Series(map("/".join, parts.itertuples(index=False, name=None)), index=table.index)
             if tags and len(table) else "")
    seed = pd.to_numeric(table["seed"], errors="coerce") if "seed" in table.columns else math.nan
    table = table.assign(step=pd.to_numeric(table["step"], errors="coerce"),
                         loss=pd.to_numeric(table["loss"], errors="coerce"), curve=curve,
                         seed=seed)
    return table[["step", "loss", "curve", "seed"]].dropna(subset=["step", "loss"])


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
    rows, curves, skipped, seeded = [], [], [], set()  # as in Gathered
    settings: dict[str, tuple[dict[str, str], dict[str, Any], Any]] = {}  # see _swept_keys
    for run_dir in run_dirs:
        name = str(run_dir.relative_to(root)) if run_dir != root else "."
        try:
            summary_rows = read_summary(run_dir)
        except _CSV_ERRORS as exc:
            skipped.append((run_dir / "summary.csv", _reason(exc)))
            continue
        try:
            own = summary_rows[0].get("pe")
            curve = read_curve(run_dir, None if own is None or pd.isna(own) else str(own))
            if curve is not None and not curve.empty:
                curves.append(curve.assign(run_dir=name))
        except _CSV_ERRORS as exc:
            skipped.append((run_dir / "metrics.csv", _reason(exc) + " (loss curve left out)"))
        overrides, choices, job = hydra_settings(run_dir)
        settings[name] = (overrides, choices, _load_yaml(run_dir / "config.yaml"))
        try:
            per_seed = read_seeds(run_dir) if len(summary_rows) == 1 else []
        except _CSV_ERRORS as exc:
            per_seed = []
            skipped.append((run_dir / "seeds.csv", _reason(exc) + " (counted as one run)"))
        if per_seed:
            seeded.add(name)
        # a job's number is its folder's (hydra.sweep.subdir: after earlier launches of a search)
        job = int(run_dir.name) if run_dir.name.isdigit() else job
        status = read_json(run_dir / "run.json").get("status", "unknown")
        for summary in [{**summary_rows[0], **seed} for seed in per_seed] or summary_rows:
            rows.append({"run_dir": name, "job": job, **summary,
                         "status": status if pd.isna(summary["status"]) else summary["status"]})
    if not rows:
        raise ConfigError(f"no readable runs under '{root}': "
                          + "; ".join(f"{p}: {why}" for p, why in skipped))
    runs = pd.DataFrame(rows)
    own_sources = {key: runs[key].copy() for key in SEED_SOURCES if key in runs.columns}
    swept = _swept_keys(runs, settings)
    per_seed = runs["run_dir"].isin(seeded)
    own_seeds = runs.loc[per_seed, "seed"] if seeded else None
    for key, values in swept.items():
        runs[key] = runs["run_dir"].map(values)
    if own_seeds is not None:  # each row's seed from seeds.csv, not the run's first seed
        runs.loc[per_seed, "seed"] = own_seeds
    metrics = runs.columns.intersection(METRICS)
    runs[metrics] = runs[metrics].apply(pd.to_numeric, errors="coerce")
    runs = _with_seed_sources(runs, own_sources, seeded, settings)
    curve_table = (pd.concat(curves, ignore_index=True) if curves
                   else pd.DataFrame(columns=["step", "loss", "curve", "seed", "run_dir"]))
    group_keys = [k for k in swept if k not in _NOT_GROUPED]
    return Gathered(root, runs, curve_table, group_keys, list(swept), skipped, superseded,
                    seeded)


def _with_seed_sources(runs: pd.DataFrame, own: dict[str, pd.Series], seeded: set[str],
                       settings: dict[str, tuple]) -> pd.DataFrame:
    """``runs`` with ``seed_init`` and ``seed_data`` columns when any row or run sets one: the
    row's own (``own``, before the swept keys were filled in), its config's, else its seed."""
    columns: dict[str, list[Any]] = {key: [] for key in SEED_SOURCES}
    set_anywhere = False
    seeds = runs["seed"] if "seed" in runs.columns else pd.Series(math.nan, index=runs.index)
    for index, run_dir, seed in zip(runs.index, runs["run_dir"], seeds, strict=True):
        for key in SEED_SOURCES:
            value = own[key].get(index) if key in own else None
            if (value is None or pd.isna(value)) and run_dir not in seeded:
                value = _config_value(settings[run_dir][2], key)
            unset = value is None or pd.isna(value)
            set_anywhere |= not unset
            columns[key].append(as_seed(seed if unset else value))
    return runs.assign(**columns) if set_anywhere else runs


def as_seed(value: Any) -> Any:
    """A whole float as an int (3.0 from a CSV with gaps -> 3): one spelling per seed."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _swept_keys(runs: pd.DataFrame, settings: dict[str, tuple[dict[str, str], dict[str, Any],
                                                             Any]]) -> dict[str, dict[str, Any]]:
    """key -> {run_dir: value} for every key whose value differs between runs; ``settings``:
    run_dir -> (its Hydra overrides, its group choices, its config.yaml)."""
    def value(key: str, overrides: dict[str, str], choices: dict[str, Any], config: Any) -> Any:
        if key in choices:
            return choices[key]
        found = _config_value(config, key)
        return overrides.get(key) if found is None else found

    swept: dict[str, dict[str, Any]] = {}
    for key in sorted({k for overrides, _, _ in settings.values() for k in overrides},
                      key=lambda k: (k == "seed", k)):
        values = {name: value(key, *setting) for name, setting in settings.items()}
        if len({str(v) for v in values.values()}) > 1:
            swept[key] = values
    if all(k in _NOT_GROUPED for k in swept):  # no Hydra overrides tell: use the settings columns
        for column in SETTING_COLUMNS:
            if column in runs.columns and runs[column].astype(str).nunique() > 1:
                swept[column] = dict(zip(runs["run_dir"], runs[column], strict=False))
    return swept
