"""``tlab extrapolate``'s configs, tasks and (scaled) models at each length."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.config.instantiate import build_task, instantiate_component
from transformer_lab.errors import ConfigError
from transformer_lab.model import TransformerModel
from transformer_lab.routines.extrapolate.plan import Plan
from transformer_lab.tasks import Task
from transformer_lab.training.trainer import evaluate_model


def config_for(cfg: DictConfig, node: DictConfig, seq_len: int, max_len: int | None) -> DictConfig:
    """A copy of ``cfg`` with PE ``node``, ``task.seq_len`` and (when given) ``model.max_len``."""
    out = copy.deepcopy(cfg)
    with_flag = OmegaConf.is_struct(out)
    OmegaConf.set_struct(out, False)
    out.pe = copy.deepcopy(node)
    out.task.seq_len = seq_len
    if max_len is not None:
        out.model.max_len = max_len
    OmegaConf.set_struct(out, with_flag)
    return out


def task_at(cfg: DictConfig, seq_len: int, what: str) -> Task:
    """The task at ``seq_len`` (same ``data_seed``); ``ConfigError`` naming ``what`` if it
    cannot be made."""
    try:
        return build_task(config_for(cfg, cfg.pe, seq_len, None))
    except ConfigError as exc:
        raise ConfigError(f"{what} ({seq_len} tokens) cannot be generated: {exc}") from None


def tasks_by_length(cfg: DictConfig, plan: Plan) -> dict[int, Task]:
    """The training task and one task per evaluation length, all with the same ``data_seed``."""
    tasks = {plan.train_len: task_at(cfg, plan.train_len, "the training length")}
    for length in plan.eval_lens:
        if length not in tasks:
            tasks[length] = task_at(cfg, length, f"evaluation length {length}")
    return tasks


def positions_reachable(model: TransformerModel, length: int) -> str | None:
    """None if the model's PE can encode ``length`` positions, else the PE's reason."""
    if model.pe_kind != "additive":
        return None
    try:
        model.positional(torch.arange(length))
    except ValueError as exc:
        return str(exc)
    return None


def scaled_model(model: TransformerModel, cfg_pe: DictConfig, settings: Mapping[str, Any]
                 ) -> TransformerModel:
    """``model`` with its RoPE rebuilt from ``cfg_pe.pe`` plus ``settings``, sharing the
    trained weights (``model`` itself when ``settings`` is empty)."""
    if not settings:
        return model
    spec = {**OmegaConf.to_container(cfg_pe.pe, resolve=True), **settings}
    scaled = copy.copy(model)  # shallow: shares the trained weights
    scaled._modules = dict(model._modules)
    scaled._modules["positional"] = instantiate_component(spec, "pe")
    return scaled


def evaluate(model: TransformerModel, task: Task, device: torch.device) -> dict[str, float]:
    """Held-out loss, token accuracy and exact match (NaN where the task has none), fp32."""
    return evaluate_model(model, task, task.eval_batch().to(device))
