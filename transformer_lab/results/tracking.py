"""Experiment trackers beside the CSV files (``logger=csv|tensorboard|mlflow``); a tracker that
fails is switched off, the CSV files never are."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

METRIC_KEYS = ("loss", "accuracy", "exact_match", "lr", "grad_norm", "tokens_per_s")
ARTIFACT_PATTERNS = ("*.csv", "*.png", "config.yaml", "run.json")
# Row columns that describe how a row was made, not which curve it belongs to (tlab 0.2 runs
# wrote ``seed_engine``).
NOT_TAGS = {"seed_engine"}


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"d_model": 8}}`` -> ``{"model.d_model": 8}`` (lists kept as values)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    return {name: value for key, child in node.items()
            for name, value in flatten(child, f"{prefix}.{key}" if prefix else str(key)).items()}


def config_params(config: Mapping[str, Any]) -> dict[str, Any]:
    """The flattened config, without Hydra's own node."""
    return flatten({key: value for key, value in config.items() if key != "hydra"})


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row, named ``split/tag.../key``: the tags are the row's
    non-measurement columns (seed, variant, ...)."""
    from transformer_lab.results.progress import MEASURE_KEYS

    tags = [f"{k}={v}" for k, v in row.items()
            if k not in MEASURE_KEYS and k not in NOT_TAGS and v is not None]
    prefix = "/".join([str(row.get("split") or "train"), *tags])
    return {f"{prefix}/{key}": float(row[key]) for key in METRIC_KEYS
            if isinstance(row.get(key), int | float) and math.isfinite(row[key])}


class TensorBoardTracker:
    """Event files in the run directory; the config as a text summary."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir))
        text = "\n".join(f"    {k}: {v}" for k, v in config_params(config).items())
        self.writer.add_text("config", text)

    def log_row(self, row: Mapping[str, Any]) -> None:
        step = int(row.get("step") or 0)
        for name, value in row_metrics(row).items():
            self.writer.add_scalar(name, value, step)

    def finish(self, run_dir: Path, status: str) -> None:
        self.writer.add_text("status", status)
        self.writer.close()


def tracking_store(value: str) -> tuple[str, str | None]:
    """(tracking URI, artifact root) for ``logger.tracking_uri``: a URI (``http://``,
    ``sqlite://``) is used as given; a plain path is a local store there, ``mlflow.db`` (MLflow's
    file store takes no new runs) beside an ``artifacts/`` folder."""
    if "://" in value or value.startswith("file:"):
        return value, None
    folder = Path(value).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}", (folder / "artifacts").as_uri()


class MlflowTracker:
    """One MLflow run per run directory, through ``MlflowClient`` (no global active run)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any],
                 logger: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri, self.artifact_root = tracking_store(str(logger["tracking_uri"]))
        self.client = MlflowClient(tracking_uri=uri)
        routine = config["routine"]["name"]
        experiment, name = str(logger.get("experiment") or routine), run_dir.name
        tags = {"tlab.run_dir": str(run_dir.resolve()), "tlab.routine": str(routine)}
        sweep = run_dir.parent
        if (sweep / "multirun.yaml").exists():  # a job of a sweep: its jobs side by side
            experiment, name = f"{experiment}/{sweep.name}", f"{sweep.name}/{run_dir.name}"
            tags.update({"tlab.sweep_dir": str(sweep.resolve()), "tlab.job": run_dir.name})
        self.run_id = self.client.create_run(self._experiment_id(experiment), run_name=name,
                                             tags=tags).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in config_params(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _experiment_id(self, name: str) -> str:
        try:
            found = self.client.get_experiment_by_name(name)
            return found.experiment_id if found is not None else \
                self.client.create_experiment(name, artifact_location=self.artifact_root)
        except Exception:  # another job of the sweep created it first
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def log_row(self, row: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        step, now = int(row.get("step") or 0), int(time.time() * 1000)
        metrics = [Metric(name, value, now, step) for name, value in row_metrics(row).items()]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, run_dir: Path, status: str) -> None:
        for pattern in ARTIFACT_PATTERNS:
            for path in sorted(run_dir.glob(pattern)):
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_tag(self.run_id, "tlab.status", status)
        self.client.set_terminated(self.run_id, "FINISHED" if status == "passed" else "FAILED")


class SafeTracker:
    """A tracker whose first error switches it off with one warning; the CSVs carry on."""

    def __init__(self, name: str, make: Any) -> None:
        self.name = name
        self.tracker: Any = None
        self._call(lambda: setattr(self, "tracker", make()), "start")

    def _call(self, action: Any, what: str) -> None:
        try:
            action()
        except Exception as exc:
            from transformer_lab.results.console import print_warning

            self.tracker = None
            print_warning(f"logger={self.name} failed to {what} ({type(exc).__name__}: "
                          f"{str(exc).strip()[:200]}); it is off for this run, the CSV files "
                          "are kept")

    def log_row(self, row: Mapping[str, Any]) -> None:
        if self.tracker is not None:
            self._call(lambda: self.tracker.log_row(row), "log a metrics row")

    def finish(self, run_dir: Path, status: str) -> None:
        if self.tracker is not None:
            self._call(lambda: self.tracker.finish(run_dir, status), "finish")
            self.tracker = None


def build_trackers(config: Mapping[str, Any], run_dir: Path) -> list[SafeTracker]:
    """The trackers ``config["logger"]`` asks for (none for ``csv`` or a config without a
    logger); ``config``: the composed config as plain containers."""
    logger = config.get("logger")
    name = "csv" if logger is None else logger.get("name") or "csv"
    makers = {"csv": None, "tensorboard": lambda: TensorBoardTracker(run_dir, config),
              "mlflow": lambda: MlflowTracker(run_dir, config, logger)}
    if name not in makers:
        from transformer_lab.errors import ConfigError

        raise ConfigError(f"logger={name} is not known; valid: {', '.join(makers)}")
    return [SafeTracker(name, makers[name])] if makers[name] is not None else []
