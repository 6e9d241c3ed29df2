"""Hyper-parameter search with Optuna's Hydra sweeper (``hydra/sweeper=optuna``): tlab's study
settings and a study ``--resume`` continues (``docs/cli.md``, "Optuna search")."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, read_write

from transformer_lab.app.sweeps import quote_value
from transformer_lab.results.run_directory import read_json
from transformer_lab.results.search_report import STUDY_FILE, STUDY_NAME
from transformer_lab.routines.objective import require_objective

LAUNCH_FILE = "search.json"  # in the sweep directory: the first job number of this launch
STUDY_CALLBACK = "hydra.callbacks.tlab_study._target_"  # the override that adds ContinuedStudy


def uses_optuna(overrides: list[str]) -> bool:
    """True when the overrides choose Optuna's sweeper."""
    return any(o.split("=", 1)[0].lstrip("+") == "hydra/sweeper" and o.endswith("=optuna")
               for o in overrides)


def sweeper_overrides(overrides: list[str], cfg: DictConfig, sweep_dir: Path) -> list[str]:
    """The ``hydra.sweeper.*`` settings tlab adds for an Optuna search and the callback that
    continues a stored study (in ``sweep_dir``, claimed or resumed: it exists)."""
    objective = require_objective(str(cfg.routine.name))  # ConfigError: exit 2
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    wanted = {"hydra.sweeper.storage": quote_value(f"sqlite:///{sweep_dir.resolve() / STUDY_FILE}"),
              "hydra.sweeper.study_name": STUDY_NAME,
              "hydra.sweeper.direction": objective.direction,
              "hydra.sweeper.max_failure_rate": "1.0",
              "hydra.sweeper.n_jobs": "1",
              f"+{STUDY_CALLBACK}": f"{__name__}.ContinuedStudy"}
    return [f"{key}={value}" for key, value in wanted.items() if key.lstrip("+") not in given]


def trial_value(run_dir: Path) -> float:
    """The objective in ``run_dir/run.json``; NaN (a failed trial) when there is none."""
    info = read_json(run_dir / "run.json")
    objective = info.get("objective") or {}
    if info.get("status") not in ("passed", "failed") or objective.get("value") is None:
        return math.nan
    value = float(objective["value"])
    return value if math.isfinite(value) else math.nan


class ContinuedStudy(Callback):
    """Before the sweeper starts: save ``multirun.yaml``, give the sweeper only the trials still
    missing from the stored study, and write this launch's first job number to ``search.json``."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(config, sweep_dir / "multirun.yaml")
        sweeper = config.hydra.sweeper
        finished, started = 0, 0
        if sweeper.storage is not None and sweeper.study_name is not None:
            finished, started = study_counts(str(sweeper.storage), str(sweeper.study_name))
        with read_write(sweeper):
            sweeper.n_trials = max(0, int(sweeper.n_trials) - finished)
        (sweep_dir / LAUNCH_FILE).write_text(json.dumps({"first_job": started}))


def job_folder(sweep_dir: str, job_num: int) -> int:
    """``${tlab.job_folder:SWEEP_DIR,NUM}``: job ``NUM``'s folder number, after earlier launches."""
    first = read_json(Path(sweep_dir) / LAUNCH_FILE).get("first_job", 0)
    return int(first) + int(job_num)


if not OmegaConf.has_resolver("tlab.job_folder"):  # hydra_app imports this module: every
    #                                                process that runs a job has it
    OmegaConf.register_new_resolver("tlab.job_folder", job_folder)


def study_counts(storage: str, study_name: str) -> tuple[int, int]:
    """(finished trials, all trials) of a stored study; trials left running marked failed."""
    import optuna
    from optuna.trial import TrialState

    if storage.startswith("sqlite:///") and not Path(storage[len("sqlite:///"):]).exists():
        return 0, 0
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        return 0, 0
    trials = study.get_trials(deepcopy=False)
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            study.tell(trial.number, state=TrialState.FAIL)
    finished = sum(1 for t in study.get_trials(deepcopy=False)
                   if t.state != TrialState.WAITING)
    return finished, len(trials)
