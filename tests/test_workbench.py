"""Issue 15 items 2-4: live progress, --version/--quiet, Optuna search, TensorBoard/MLflow."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from transformer_lab.results.progress import RunProgress, progress_bar
from transformer_lab.results.run_directory import METRIC_COLUMNS, CsvLog, TaggedLog

TINY = ["experiment=smoke"]


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --- item 2: progress, --version, --quiet ---------------------------------------------------

def recorded_progress() -> tuple[RunProgress, Console]:
    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    return RunProgress(enabled=True, console=console), console


def test_progress_bar_follows_metrics_rows_of_every_series(tmp_path):
    progress, console = recorded_progress()
    log = CsvLog(tmp_path / "metrics.csv", METRIC_COLUMNS, [progress.on_row])
    with progress_bar(TaggedLog(log, stage="reverse"), "reversal: pe=rope", total=40):
        for seed in (0, 1):  # two series: their steps add up
            seeded = TaggedLog(log, stage="reverse", seed=seed)
            seeded.write({"step": 10, "split": "train", "loss": 1.25, "tokens_per_s": 5000.0})
            seeded.write({"step": 10, "split": "val", "loss": 1.5, "exact_match": 0.75})
        text = console.export_text(clear=False)
    text = console.export_text()
    assert "reversal: pe=rope" in text
    assert "20/20" in text  # stopped early at 20 of 40 steps: the bar ends full at 20
    assert "loss 1.2500" in text and "exact 0.750" in text and "5,000 tok/s" in text
    assert len(rows_of(tmp_path / "metrics.csv")) == 4  # the CSV is untouched by the bar


def test_progress_is_off_when_quiet_and_plain_when_not_a_terminal(tmp_path):
    assert not RunProgress.for_terminal(quiet=True).enabled
    plain = RunProgress.for_terminal()  # pytest captures stdout: not a terminal
    assert plain.enabled and plain.plain  # log lines, no live bar
    log = CsvLog(tmp_path / "m.csv", METRIC_COLUMNS)
    with progress_bar(log, "no run progress here", total=5):  # no RunProgress: a no-op
        log.write({"step": 1, "split": "train", "loss": 1.0})


def test_quiet_flag_becomes_an_override(tlab, tmp_path):
    code, out, _ = tlab(*TINY, "--quiet", f"hydra.run.dir={tmp_path / 'run'}")
    assert code == 0
    assert "progress: false" in (tmp_path / "run" / "config.yaml").read_text()


def test_version_prints_versions_without_importing_torch():
    script = ("import sys; sys.argv = ['tlab', '--version']\n"
              "from transformer_lab.cli import app\n"
              "try:\n    app()\nexcept SystemExit:\n    pass\n"
              "print('torch imported' if 'torch' in sys.modules else 'no torch')")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60).stdout
    assert out.startswith("tlab ") and ", torch " in out and ", hydra 1." in out
    assert out.strip().endswith("no torch")


# --- item 4: trackers -----------------------------------------------------------------------

def test_tensorboard_events_read_back(tlab, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "tb"
    code, _, _ = tlab(*TINY, "logger=tensorboard", f"hydra.run.dir={run_dir}")
    assert code == 0
    events = EventAccumulator(str(run_dir))
    events.Reload()
    train = events.Scalars("train/loss")
    csv_rows = [r for r in rows_of(run_dir / "metrics.csv") if r["split"] == "train"]
    assert [e.step for e in train] == [int(r["step"]) for r in csv_rows]
    assert train[-1].value == pytest.approx(float(csv_rows[-1]["loss"]), rel=1e-5)
    assert "val/loss" in events.Tags()["scalars"]


def test_mlflow_run_read_back(tlab, tmp_path):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store, run_dir = tmp_path / "mlruns", tmp_path / "ml"
    code, _, _ = tlab(*TINY, "logger=mlflow", f"logger.tracking_uri={store}",
                      f"hydra.run.dir={run_dir}")
    assert code == 0
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("smoke")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["tlab.status"] == "passed"
    assert run.data.params["model.d_model"] == "8" and run.data.params["pe.name"] == "rope"
    history = client.get_metric_history(run.info.run_id, "train/loss")
    csv_rows = [r for r in rows_of(run_dir / "metrics.csv") if r["split"] == "train"]
    assert [m.step for m in history] == [int(r["step"]) for r in csv_rows]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"metrics.csv", "summary.csv", "smoke.csv", "config.yaml"} <= artifacts


def test_a_failing_tracker_never_loses_the_csv_files(tlab, tmp_path):
    pytest.importorskip("mlflow")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the MLflow store should go")
    run_dir = tmp_path / "run"
    code, _, err = tlab(*TINY, "logger=mlflow", f"logger.tracking_uri={blocker}",
                        f"hydra.run.dir={run_dir}")
    assert code == 0
    err = " ".join(err.split())
    assert "logger=mlflow failed to start" in err and "the CSV files are kept" in err
    assert len(rows_of(run_dir / "metrics.csv")) >= 10
    assert rows_of(run_dir / "summary.csv")[0]["status"] == "passed"


def test_a_tracker_failing_mid_run_never_loses_rows(tlab, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from transformer_lab.results import tracking

    def broken(self, row):
        raise OSError("disk of the tracker is full")

    monkeypatch.setattr(tracking.TensorBoardTracker, "log_row", broken)
    run_dir = tmp_path / "run"
    code, _, err = tlab(*TINY, "logger=tensorboard", f"hydra.run.dir={run_dir}")
    assert code == 0
    assert "failed to log a metrics row (OSError: disk of the tracker is full)" in " ".join(
        err.split())
    assert err.count("logger=tensorboard failed") == 1  # switched off after the first error
    assert len(rows_of(run_dir / "metrics.csv")) >= 10


# --- item 3: Optuna search ------------------------------------------------------------------

def study_states(sweep_dir: Path) -> list[str]:
    import optuna

    study = optuna.load_study(study_name="tlab", storage=f"sqlite:///{sweep_dir / 'optuna.db'}")
    return [t.state.name for t in study.trials]


def test_optuna_tpe_search_resumes_and_reports(tlab, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "search"
    search = ["-m", *TINY, "hydra/sweeper=optuna", "hydra.sweeper.sampler.n_startup_trials=2",
              "train.lr=interval(1e-3,3e-2)", "model.d_model=choice(8,16)"]
    code, _, _ = tlab(*search, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={sweep}")
    assert code in (0, 1)  # a trial whose smoke check fails is a finished trial
    assert study_states(sweep) == ["COMPLETE"] * 4
    # resumed: the study continues up to 6 trials in all, in job folders 4 and 5
    code, _, _ = tlab("--resume", sweep, "hydra.sweeper.n_trials=6")
    assert code in (0, 1)
    assert study_states(sweep) == ["COMPLETE"] * 6
    assert all((sweep / str(job) / "run.json").exists() for job in range(6))
    from transformer_lab.results.search_report import study_rows

    rows, best = study_rows(sweep)
    assert [r["job"] for r in rows] == list(range(6))
    assert best["value"] == min(r["value"] for r in rows)
    recorded = {int(r["job"]): float(r["final_loss"]) for r in rows_of(sweep / "sweep.csv")}
    assert all(recorded[r["job"]] == pytest.approx(r["value"], rel=1e-5) for r in rows)
    from transformer_lab.cli.report import report

    report(sweep, None, None, None)
    assert len(rows_of(sweep / "search-trials.csv")) == 6


def test_optuna_refuses_a_routine_without_objective(tlab, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    code, _, err = tlab("-m", "experiment=budget", "hydra/sweeper=optuna",
                        f"hydra.sweep.dir={tmp_path / 's'}")
    assert code == 2 and "returns no objective" in err and "reverse" in err
