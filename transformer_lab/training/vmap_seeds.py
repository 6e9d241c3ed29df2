"""The vmap engine of ``multiseed.fit_seeds``: S seeds as one vectorised model.

The S models' parameters are stacked along a leading seed axis (``torch.func.stack_module_state``)
and one step runs all of them: ``torch.func.vmap`` over the model called with seed s's
parameters swapped in (what ``torch.func.functional_call`` does, without its per-call module
walk) computes the S losses, one backward gives every seed its own gradient, each seed's
gradient is clipped by its own norm, and one AdamW over the stacked tensors is S independent
AdamWs. Under vmap, attention is written out (``written_out_attention``): SDPA's fused kernels
have no batching rule. It works for any model whose training is a pure function of (weights,
batch) (``seed_engines.vectorisable``), a user's own components included; the seed-stacked engine
(``seed_stack``) is faster where it applies.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from torch import nn
from torch.func import stack_module_state, vmap

from transformer_lab.components.attention import written_out_attention
from transformer_lab.tasks import Batch
from transformer_lab.training.optim import adamw_param_groups, make_adamw, set_lr
from transformer_lab.training.seed_stack import clip_seed_gradients
from transformer_lab.training.trainer import Trainer, sequence_loss


def _parameter_slots(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(module, attribute, name in named_parameters) for every parameter slot, tied ones too."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(module, attr, names[id(param)])
            for module in model.modules()
            for attr, param in module._parameters.items() if param is not None]


class VmapSeeds:
    """The stacked parameters (``stack_module_state``), their optimiser and one step of every
    seed through ``torch.func.vmap``; the loop is ``multiseed.train_together``."""

    def __init__(self, cfg: DictConfig, seeds: list[int], models: list[nn.Module],
                 trainers: list[Trainer], horizon: int) -> None:
        self.cfg = cfg
        self.seeds = seeds
        self.models = models
        self.trainers = trainers
        self.train = trainers[0]._train  # plain copy of cfg.train
        self.device = trainers[0].device
        params, _ = stack_module_state(models)  # name -> (N, *shape) leaves
        self.params = params
        self.names = list(params)
        # Each seed's model keeps views into the stacked tensors, so it always holds the
        # current weights (evaluation, exact match and the caller use them unchanged).
        for k, model in enumerate(models):
            for name, param in model.named_parameters():
                param.data = params[name].detach()[k]
        stacked = [params[n] for n in self.names]
        groups = adamw_param_groups(stacked, float(cfg.train.weight_decay), leading_dims=1)
        self.schedule = trainers[0].schedule
        self.d_model = trainers[0].d_model
        self.horizon = horizon  # the schedule's total steps, shared by every seed
        lr = self.schedule(1, self.train, self.d_model, horizon)
        self.optimizer = make_adamw(groups, lr, tuple(cfg.train.betas))
        self.grad_clip = trainers[0]._grad_clip
        self.autocast = trainers[0].autocast
        base = models[0]
        slots = _parameter_slots(base)

        def seed_loss(seed_params: dict[str, torch.Tensor], inputs: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
            # functional_call(base, seed_params, (inputs,)) without its per-call module walk
            saved = [module._parameters[attr] for module, attr, _ in slots]
            try:
                for module, attr, name in slots:
                    module._parameters[attr] = seed_params[name]
                logits = base(inputs)  # (B, T, V) for this seed
            finally:
                for (module, attr, _), param in zip(slots, saved, strict=True):
                    module._parameters[attr] = param
            return sequence_loss(logits, targets)

        self.losses = vmap(seed_loss)  # (params (N, ...), inputs (N, B, T), targets) -> (N,)

    def clip(self) -> torch.Tensor:
        """Clip each seed's gradient by its own total norm (``seed_stack.clip_seed_gradients``,
        the same layout: a leading seed axis); returns the norms (N,)."""
        return clip_seed_gradients([self.params[n] for n in self.names], self.grad_clip,
                                   len(self.seeds))

    def step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step of every seed (``batch``: (S, B, T), row k seed k's)."""
        for trainer in self.trainers:
            trainer.step_count += 1
        lr = self.schedule(self.trainers[0].step_count, self.train, self.d_model, self.horizon)
        set_lr(self.optimizer, lr)
        inputs, targets = batch.inputs.to(self.device), batch.targets.to(self.device)  # (N, B, T)
        for model in self.models:
            if not model.training:
                model.train()
        with self.autocast, written_out_attention():  # what vmap batches (see there)
            losses = self.losses(self.params, inputs, targets)  # (N,)
        for p in self.params.values():
            p.grad = None
        losses.sum().backward()  # seeds are independent: each gets its own gradient
        norms = self.clip()
        self.optimizer.step()
        return losses.detach(), norms, lr
