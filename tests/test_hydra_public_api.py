"""tlab drives Hydra through its public API: ``hydra.main`` (``app.hydra_app.run_hydra``) and,
for an Optuna search, a Hydra callback (``app.search.ContinuedStudy``) with the job folders
numbered by the ``tlab.job_folder`` resolver of ``hydra.sweep.subdir``."""

from __future__ import annotations

import json
import os
import sys

import pytest
from omegaconf import OmegaConf

from transformer_lab.app.hydra_app import FULL_ERROR, run_hydra
from transformer_lab.app.search import LAUNCH_FILE, ContinuedStudy, job_folder


class JobError(Exception):
    pass


def test_run_hydra_carries_a_chosen_error_out_and_restores_argv_and_env(tmp_path, monkeypatch):
    monkeypatch.delenv(FULL_ERROR, raising=False)
    argv = list(sys.argv)
    seen = {}

    def failing(cfg):
        seen["argv"], seen["env"] = list(sys.argv), os.environ.get(FULL_ERROR)
        raise JobError("the job failed")

    overrides = ["experiment=smoke", f"hydra.run.dir={tmp_path / 'run'}"]
    with pytest.raises(JobError, match="the job failed"):
        run_hydra(overrides, failing, reraise=(JobError,))
    assert seen == {"argv": argv, "env": "1"}  # the job sees this process's command line
    assert sys.argv == argv and FULL_ERROR not in os.environ
    assert (tmp_path / "run" / ".hydra" / "overrides.yaml").is_file()  # Hydra ran the job


def test_run_hydra_reports_another_error_as_hydra_does(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(FULL_ERROR, raising=False)

    def failing(cfg):
        raise ValueError("not the chosen kind")

    code = run_hydra(["experiment=smoke", f"hydra.run.dir={tmp_path / 'run'}"], failing,
                     reraise=(JobError,))
    assert code == 1 and "ValueError: not the chosen kind" in capsys.readouterr().err
    monkeypatch.setenv(FULL_ERROR, "1")  # the user's HYDRA_FULL_ERROR=1: raised, and kept
    with pytest.raises(ValueError):
        run_hydra(["experiment=smoke", f"hydra.run.dir={tmp_path / 'run2'}"], failing,
                  reraise=(JobError,))
    assert os.environ[FULL_ERROR] == "1"


def test_continued_study_counts_the_stored_trials_and_numbers_new_jobs_after_them(tmp_path):
    optuna = pytest.importorskip("optuna")
    from optuna.trial import TrialState

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="tlab", storage=storage)
    for value in (1.0, 2.0):
        study.tell(study.ask(), value)
    study.ask()  # left running by an interrupted search
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}, "sweeper": {
        "storage": storage, "study_name": "tlab", "n_trials": 5}}})
    assert job_folder(str(tmp_path), 1) == 1  # no earlier launch: the job's own number

    ContinuedStudy().on_multirun_start(config=config)

    states = [t.state for t in optuna.load_study(study_name="tlab", storage=storage).trials]
    assert states == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.FAIL]
    assert config.hydra.sweeper.n_trials == 5 - 3  # the failed one counts as finished
    assert json.loads((tmp_path / LAUNCH_FILE).read_text()) == {"first_job": 3}
    assert [job_folder(str(tmp_path), n) for n in (0, 1)] == [3, 4]
    assert OmegaConf.load(tmp_path / "multirun.yaml").hydra.sweeper.n_trials == 5


def test_choices_offered_in_the_config_store_are_gone_after_the_command(tmp_path):
    """Hydra has no public way to remove a ConfigStore entry: a command restores the store it
    found, so a later command in this process never merges an old node into its own file."""
    from hydra.core.config_store import ConfigStore

    from transformer_lab.config.tree import config_store_kept, store_choices

    def stored(group: str) -> list[str]:
        try:
            return ConfigStore.instance().list(group)
        except OSError:  # no such group in the store
            return []

    (tmp_path / "activation").mkdir()  # an old-named folder: its choices go to the store
    (tmp_path / "activation" / "h29_ffn.yaml").write_text("name: h29_ffn\n")
    launchers = stored("hydra/launcher")
    with config_store_kept():
        store_choices([tmp_path])
        assert "h29_ffn.yaml" in stored("ffn")
    assert "h29_ffn.yaml" not in stored("ffn")
    assert stored("hydra/launcher") == launchers  # what was stored before is kept
