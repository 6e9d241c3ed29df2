"""The pre-flight: a composed config checked once before a run writes anything; the task and
model it builds are handed to the routine. Not the validation routine (``tlab validate``)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_lab.app.resources import check_resources
from transformer_lab.config.architecture import check_architecture
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.schema import check_schema
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_checked_model
from transformer_lab.routines import (
    JobInputs,
    check_routine,
    check_settings,
    check_unread,
    check_values,
)
from transformer_lab.training.distributed import resolve_device
from transformer_lab.training.optimizers import check_optimizer
from transformer_lab.training.pretrained import load_pretrained
from transformer_lab.training.schedules import schedule


def preflight(cfg: DictConfig) -> JobInputs:
    """Check ``cfg`` before its run; its typed spec, the task and model, built once
    (``ConfigError``: one line). ``cfg.model.vocab_size`` becomes the task's."""
    spec = check_unbuilt(cfg)
    task = build_task(spec)
    requested_vocab = spec.model.vocab_size
    if requested_vocab is not None and requested_vocab != task.vocab_size:
        raise ConfigError(f"model.vocab_size={requested_vocab} is not used: the vocabulary is "
                          f"the task's ({task.vocab_size}); set task.vocab_size instead")
    cfg.model.vocab_size = task.vocab_size  # (the run's config.yaml and its variants say it)
    spec = spec.with_vocab(task.vocab_size)
    check_resources(spec, task)  # refuse what cannot fit in memory, before building the model
    init_seed = spec.seed_sources(spec.seed)[0]  # seed_init=, else seed
    inputs = JobInputs(spec=spec, task=task,
                       model=build_checked_model(spec.model, task.model_seq_len, init_seed))
    check_optimizer(spec.train.optimizer, inputs.model)  # the optimizer group
    # --from-hf DIR, --from-run RUN: its weights, checked to fit the model built here
    load_pretrained(inputs.model, spec)
    with torch.random.fork_rng(devices=[]):
        check_routine(spec, inputs)  # the routine's own settings (e.g. extrapolate's lengths)
    return inputs


def check_unbuilt(cfg: DictConfig) -> RunSpec:
    """The checks that need neither data nor a model (all that ``--cfg`` and ``--info`` run);
    the config's typed spec."""
    check_schema(cfg)  # types, ranges, required keys (config/schema.py)
    check_settings(cfg)  # the routine's own keys (its module's SETTINGS)
    spec = RunSpec.of(cfg)  # also the typed train.* settings' own checks
    schedule(spec.train.schedule)  # a known train.schedule
    check_values(spec)  # the routine's values a rule cannot say
    check_unread(spec, OmegaConf.select(cfg, "hydra.overrides.task", default=None) or [])
    check_architecture(spec.model)  # heads / head size, parallel block, RoPE and MoE bounds
    resolve_device(spec.train.device)  # auto, cpu, cuda, cuda:K
    return spec
