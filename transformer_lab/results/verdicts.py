"""The verdict columns of ``tlab report`` over runs with a seed key: groups of one stratum tested
against its baseline group, paired by seed (``docs/cli.md``, "tlab report")."""

from __future__ import annotations

import pandas as pd

from transformer_lab.errors import ConfigError
from transformer_lab.measures.statistics import (
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.results.gather import SEED_SOURCES, Gathered, as_seed

# Summary numbers where a larger value is better; every other one is better lower.
HIGHER_IS_BETTER = {"best_exact_match", "tokens_per_s"}


def sample_ids(runs: pd.DataFrame) -> pd.Series:
    """Per row, what pairs it across groups: ``seed``, or ``seed/seed_init/seed_data``."""
    if not set(SEED_SOURCES) <= set(runs.columns):
        return runs["seed"]
    parts = runs[["seed", *SEED_SOURCES]]
    labels = ["/".join(str(as_seed(v)) for v in row) for row in parts.itertuples(index=False)]
    return pd.Series(labels, index=runs.index).where(parts.notna().any(axis=1))


def compared_key(pivot: pd.DataFrame, keys: list[str], baseline: str | None) -> tuple[str, str]:
    """(key, baseline value) from ``--baseline`` (``KEY=VALUE``, ``VALUE`` or None)."""
    if baseline is None:
        return keys[0], str(pivot[keys[0]].iloc[0])
    key, _, value = baseline.rpartition("=")
    if key and key not in keys:
        raise ConfigError(f"--baseline {baseline}: '{key}' is not a grouped key; valid: "
                          f"{', '.join(keys)}")
    key = key or next((k for k in keys if value in set(pivot[k].astype(str))), keys[0])
    values = list(dict.fromkeys(pivot[key].astype(str)))
    if value not in values:
        raise ConfigError(f"--baseline {baseline}: no group has {key}={value}; valid: "
                          f"{', '.join(f'{key}={v}' for v in values)}")
    return key, value


def verdict_columns(gathered: Gathered, pivot: pd.DataFrame, metric: str,
                    baseline: str | None = None, alpha: float = 0.05) -> pd.DataFrame:
    """``pivot`` with ``baseline``, ``<metric>_ci_low/high`` and ``VERDICT_COLUMNS`` when the
    runs are grouped and carry more than one seed."""
    keys, runs = gathered.group_keys, gathered.runs
    seeds = sample_ids(runs) if keys and "seed" in runs.columns else pd.Series(dtype=object)
    if seeds.dropna().astype(str).nunique() < 2:
        return pivot
    key, value = compared_key(pivot, keys, baseline)
    others = [k for k in keys if k != key]
    runs = runs.assign(**{k: runs[k].astype(str) for k in keys}, seed=seeds)
    runs = runs[[*keys, "seed", metric]].dropna(subset=["seed"])
    columns = ["baseline", f"{metric}_ci_low", f"{metric}_ci_high", *VERDICT_COLUMNS]
    out = pivot.assign(**dict.fromkeys(columns, None))  # object columns, None until filled
    strata = runs.groupby(others, sort=False) if others else [((), runs)]
    for stratum, rows in strata:
        where = out[others].astype(str).eq(list(stratum)).all(axis=1)
        out.loc[where, "baseline"] = f"{key}={value}"
        if value not in set(rows[key]):
            out.loc[where, "note"] = f"no {key}={value} group with these settings"
            continue
        try:
            table = verdict_table(rows.rename(columns={key: "group"}), "group", metric,
                                  baseline=value, alpha=alpha,
                                  lower_is_better=metric not in HIGHER_IS_BETTER)
        except ValueError as exc:  # a (group, seed) pair twice: the runs do not pair
            out.loc[where, "note"] = str(exc)
            continue
        for index in out.index[where]:
            for column, cell in table.loc[str(out.at[index, key])].items():
                out.at[index, column] = cell
    return out


def verdict_lines(pivot: pd.DataFrame, keys: list[str], metric: str) -> list[str]:
    """One plain-language line per group tested against its baseline group."""
    if "verdict" not in pivot.columns:
        return []
    lines = []
    for _, row in pivot.iterrows():
        if not has_verdict(row):
            continue
        key = str(row["baseline"]).partition("=")[0]
        name = ", ".join(f"{k}={row[k]}" for k in keys if k != key)
        label = f"{key}={row[key]}" + (f" ({name})" if name else "")
        lines.append(describe(label, row, str(row["baseline"]), value=metric))
    return lines
