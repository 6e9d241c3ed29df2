"""``tlab report`` on an Optuna search (``app/search.py``): its trials and the best parameters."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

STUDY_FILE = "optuna.db"  # in the sweep directory
STUDY_NAME = "tlab"


def study_rows(sweep_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(one row per trial, the best trial's row or None); ``([], None)`` without a study."""
    path = Path(sweep_dir) / STUDY_FILE
    if not path.exists():
        return [], None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY_NAME, storage=f"sqlite:///{path.resolve()}")
    rows = [{"trial": trial.number, "job": trial.number, "state": trial.state.name,
             "value": trial.value, **{f"param:{k}": v for k, v in trial.params.items()}}
            for trial in study.get_trials(deepcopy=False)]
    complete = [r for r in rows if r["state"] == "COMPLETE" and r["value"] is not None]
    if not complete:
        return rows, None
    pick = max if study.direction.name == "MAXIMIZE" else min
    return rows, {**pick(complete, key=lambda r: r["value"]), "direction": study.direction.name}


def write_study_report(sweep_dir: Path, out_dir: Path) -> Path | None:
    """Print the trials and the best parameters of the study in ``sweep_dir`` and write them to
    ``out_dir/search-trials.csv``; None when ``sweep_dir`` holds no study."""
    from rich.table import Table

    from transformer_lab.results.console import console

    rows, best = study_rows(sweep_dir)
    if not rows:
        return None
    columns = list(dict.fromkeys(key for row in rows for key in row))
    out = Path(out_dir) / "search-trials.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    table = Table(*(column.removeprefix("param:") for column in columns),
                  title=f"Optuna search - {len(rows)} trials")
    for row in rows:
        table.add_row(*[_cell(row.get(c)) for c in columns])
    console.print(table)
    if best is not None:
        params = ", ".join(f"{k.removeprefix('param:')}={_cell(v)}" for k, v in best.items()
                           if k.startswith("param:"))
        console.print(f"best trial {best['trial']} ({best['direction'].lower()}): value "
                      f"{best['value']:.6g} with {params}", highlight=False, markup=False)
    return out


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)
