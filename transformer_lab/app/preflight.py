"""The pre-flight: a composed config checked once before a run writes anything; the task and
model it builds are handed to the routine. Not the validation routine (``tlab validate``)."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from transformer_lab.app.resources import check_resources
from transformer_lab.config.architecture import check_architecture
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.schema import check_schema
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_checked_model
from transformer_lab.routines import JobInputs, check_routine, check_settings
from transformer_lab.routines.variants import seed_sources, train_settings
from transformer_lab.training.distributed import resolve_device
from transformer_lab.training.optimizers import check_optimizer
from transformer_lab.training.pretrained import load_pretrained


def preflight(cfg: DictConfig) -> JobInputs:
    """Check ``cfg`` before its run; the task and model, built once. ``ConfigError`` (one line)."""
    check_unbuilt(cfg)
    requested_vocab = cfg.model.vocab_size
    task = build_task(cfg)
    if requested_vocab is not None and requested_vocab != task.vocab_size:
        raise ConfigError(f"model.vocab_size={requested_vocab} is not used: the vocabulary is "
                          f"the task's ({task.vocab_size}); set task.vocab_size instead")
    check_resources(cfg, task)  # refuse what cannot fit in memory, before building the model
    init_seed = seed_sources(cfg, int(cfg.seed))[0]  # seed_init=, else seed
    inputs = JobInputs(task=task, model=build_checked_model(cfg, task.model_seq_len, init_seed))
    check_optimizer(train_settings(cfg).optimizer, inputs.model)  # the optimizer group
    # --from-hf DIR, --from-run RUN: its weights, checked to fit the model built here
    load_pretrained(inputs.model, cfg)
    with torch.random.fork_rng(devices=[]):
        check_routine(cfg, inputs)  # the routine's own settings (e.g. extrapolate's lengths)
    return inputs


def check_unbuilt(cfg: DictConfig) -> None:
    """The checks that need neither data nor a model (all that ``--cfg`` and ``--info`` run)."""
    check_schema(cfg)  # types, ranges, required keys (config/schema.py)
    check_settings(cfg)  # the routine's own keys (its module's SETTINGS)
    check_architecture(cfg)  # heads / head size, parallel block, RoPE and MoE bounds
    train_settings(cfg)  # the typed train.* settings' own checks (train.schedule...)
    resolve_device(cfg.train.device)  # auto, cpu, cuda, cuda:K

