"""Training the chosen PE of ``reverse-task`` together with its NoPE control.

The control (``pe=none``, same model, seed and data) trains for as many steps as the chosen PE
used: after it, or - where a core is free (``control_on_thread``) - beside it on a second thread,
one step behind it (``transformer_lab.training.lockstep.Lockstep``), with the numbers it would
get trained after it. Its metrics rows are held back (``BufferedLog``) so that ``metrics.csv``
reads as in a serial run. The checks on the results are in ``reverse_results.py``.
"""

from __future__ import annotations

import threading

import torch
from omegaconf import DictConfig

from transformer_lab.config.instantiate import build_task
from transformer_lab.model import build_model
from transformer_lab.results.run_directory import CsvLog, TaggedLog
from transformer_lab.routines.variants import stage_log
from transformer_lab.training.lockstep import Lockstep
from transformer_lab.training.threads import available_cores
from transformer_lab.training.trainer import Trainer, TrainResult, count_parameters

NOPE = "none"


def prepare_trainer(cfg: DictConfig, metrics: TaggedLog | BufferedLog | None) -> Trainer:
    """Seed, build the task and the model of ``cfg``, and wrap them in a ``Trainer``."""
    task = build_task(cfg)
    model = build_model(cfg, seed=cfg.seed)
    return Trainer(model, task, cfg.train, cfg.model.d_model, cfg.seed, metrics)


def train_to_target(cfg: DictConfig, metrics: TaggedLog | None, max_steps: int,
                    target: float | None) -> tuple[TrainResult, int]:
    """Seed, build and train one model until held-out exact match >= ``target`` or
    ``max_steps``; returns the training result and the parameter count."""
    trainer = prepare_trainer(cfg, metrics)
    return trainer.fit(max_steps, target_exact_match=target), count_parameters(trainer.model)


def control_on_thread(cfg: DictConfig) -> bool:
    """Train the NoPE control on a second thread beside the chosen PE (``routine.control_thread``:
    auto = when the machine has a core to spare, no dropout draws from the shared global RNG,
    and the run is not a job of a sweep, whose launcher decides how many jobs share the cores)."""
    setting = cfg.routine.get("control_thread", "auto")
    if setting != "auto":
        return bool(setting)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    in_sweep = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    threads = cfg.train.get("threads") or torch.get_num_threads()  # null: torch's default
    dropout = any(float(v) for v in cfg.model.dropout.values())
    return not in_sweep and not dropout and available_cores() >= 2 * int(threads)


class BufferedLog:
    """Keeps a follower thread's metrics rows until ``flush`` writes them in one piece (so
    ``metrics.csv`` holds the chosen PE's rows, then the control's, as in a serial run)."""

    def __init__(self, tags: TaggedLog) -> None:
        self.tags = tags
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.rows.append(row)

    def flush(self) -> None:
        for row in self.rows:
            self.tags.write(row)
        self.rows.clear()


def train_with_control(cfg: DictConfig, nope_cfg: DictConfig, log: CsvLog | None, stage: str,
                       max_steps: int, target: float, on_thread: bool, label: str
                       ) -> tuple[Trainer, TrainResult, Trainer, TrainResult]:
    """The chosen PE (``label`` in the metrics rows) until solved (or ``max_steps``), and the
    NoPE control for as many steps: after it, or beside it on a second thread following it in
    ``Lockstep``."""
    chosen = prepare_trainer(cfg, stage_log(log, stage, label, cfg.seed))
    control_tags = stage_log(log, stage, NOPE, cfg.seed)
    if not on_thread:  # (each model is built just before it trains, as in a run of its own)
        result = chosen.fit(max_steps, target_exact_match=target)
        budget = result.solved_step or result.steps
        control = prepare_trainer(nope_cfg, control_tags)
        return chosen, result, control, control.fit(budget, target_exact_match=target,
                                                    horizon=max_steps)

    control_log = BufferedLog(control_tags)
    control = prepare_trainer(nope_cfg, control_log)
    lockstep, outcome = Lockstep(), {}

    def follow() -> None:
        try:
            outcome["result"] = control.fit(max_steps, target_exact_match=target,
                                            follow=lockstep)
        except BaseException as exc:  # re-raised on the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=follow, name="nope-control")
    thread.start()
    try:
        result = chosen.fit(max_steps, target_exact_match=target, lead=lockstep)
    finally:
        thread.join()  # the control stops where the chosen PE stopped (also on an error)
        control_log.flush()
    if "error" in outcome:
        raise outcome["error"]
    return chosen, result, control, outcome["result"]
