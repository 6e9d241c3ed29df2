"""Train S seeds as one model whose parameters carry a leading seed axis.

``stack_models([m_0, ..., m_{S-1}])`` turns S single models (each built by
``torch.manual_seed(s); build_model(cfg)``) into one: a copy of the model in which only the leaf
layers (Linear, Embedding, the norm layers, the learned PE and T5 bias tables) are replaced by
their seed-stacked forms (``seed_stack_layers.stacked_form``: the ``seed_stacked`` class a tlab
component declares, ``components/seed_stacked.py``, or torch's leaf mapping); every other
component is unchanged and sees a
batch of S*B sequences, seed-major (rows s*B .. s*B+B-1 are seed s's). Linear layers become one
``baddbmm`` [S, B*T, in] @ [S, in, out]; attention runs on (S*B, H, T, Dh) through SDPA, so its
fused kernels keep working (unlike ``torch.func.vmap``). Parameter-free parts (sinusoidal, RoPE,
ALiBi, activations, residual scales) are shared.

A stacked step (``SeedStackedTrainer.train_step``) is S single steps at once:
    loss = sum_s L_s, with L_s seed s's mean loss      -> grad of seed s's slice = its own grad
    clip: g_s <- g_s * min(1, c / (||g_s|| + 1e-6)), ||g_s|| over seed s's slices only
    AdamW over the stacked tensors: its update is element-wise, so it is S independent AdamWs;
    weight decay on the tensors that are matrices in the single model (leading_dims=1).
So seed s of a stacked run gives the numbers of the single run with seed s, up to the float
rounding of batched kernels (``tests/test_seed_stack.py``).

``stackable(model)`` says why a model cannot be stacked (a user's class with parameters, dropout,
an auxiliary loss over the batch): the caller then takes the vmap or one-after-another path
and reports which. ``seed_state_dict(stacked, s)`` / ``unstack_model(stacked, s)`` give seed s's
weights under the single model's names. The engine ``multiseed.fit_seeds`` runs,
``StackedSeeds``, is in ``seed_groups.py`` (it stacks the seeds in cache-sized groups).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from transformer_lab.components.seed_stacked import SeedStackedLayer
from transformer_lab.model import TransformerModel
from transformer_lab.tasks import IGNORE_INDEX, Batch
from transformer_lab.training.optim import make_adamw, set_lr
from transformer_lab.training.seed_stack_layers import stacked_form
from transformer_lab.training.trainer import SCHEDULES, PlainConfig

_KNOWN_MODULES = ("torch.nn.", "transformer_lab.")  # classes whose forward is known to be safe


def _leaves(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every layer that has a stacked form (``stacked_form``), outermost
    first (the embedding inside a T5 bias belongs to the bias)."""
    found: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        inside = any(name.startswith(f"{outer}.") for outer, _ in found)
        has_parameters = next(module.parameters(), None) is not None
        if not inside and has_parameters and stacked_form(module) is not None:
            found.append((name, module))
    return found


def stackable(model: nn.Module) -> str | None:
    """None if ``model``'s seeds can be stacked, else the reason they cannot (a user's own
    class holding parameters or state, dropout, tied weights)."""
    if not isinstance(model, TransformerModel):
        return f"{type(model).__name__} is not a TransformerModel"
    leaves = [name for name, _ in _leaves(model)]
    for name, module in model.named_modules():
        label = f"{name or 'model'} ({type(module).__name__})"
        if name in leaves or any(name.startswith(f"{leaf}.") for leaf in leaves):
            continue
        if any(p is not None for p in module._parameters.values()):
            return f"{label} holds parameters in a class seed stacking does not know"
        if isinstance(module, nn.modules.batchnorm._NormBase):
            return f"{label} normalises over the batch in a class seed stacking does not know"
        state = [b for b in module._buffers if b not in module._non_persistent_buffers_set]
        if state:
            return f"{label} keeps module state ({', '.join(state)})"
        if hasattr(module, "aux_loss"):
            return f"{label} computes an auxiliary loss over the whole batch (it would mix seeds)"
        if isinstance(module, nn.Dropout) and module.p > 0:
            return f"{label} dropout p={module.p}: per-seed masks would differ from single runs"
        p = getattr(module, "dropout", None)
        if isinstance(p, float) and p > 0:
            return f"{label} attention dropout p={p}: per-seed masks would differ"
        known = type(module).__module__.startswith(_KNOWN_MODULES) or type(module) is nn.Module
        if not known and any(True for _ in module.parameters()):
            return f"{label} is a user's class around layers with parameters (it may use them " \
                   f"directly)"
    n_unique = len(list(model.parameters()))
    if n_unique != len(list(model.named_parameters(remove_duplicate=False))):
        return "the model shares (ties) parameters between layers"
    return None


def _replace(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, module)


def _copy_without_parameters(model: nn.Module) -> nn.Module:
    """A deep copy that shares the parameters (all of them sit in leaves that are replaced)."""
    return copy.deepcopy(model, memo={id(p): p for p in model.parameters()})


def stack_models(models: Sequence[TransformerModel]) -> TransformerModel:
    """One model holding S seeds: leaf layers stacked from ``models`` (same config, one per
    seed, seed-major); ``ValueError`` if ``stackable`` refuses them or they differ in shape."""
    if not models:
        raise ValueError("stack_models needs at least one model")
    reason = stackable(models[0])
    if reason is not None:
        raise ValueError(f"cannot stack seeds: {reason}")
    shapes = [[(n, p.shape) for n, p in m.named_parameters()] for m in models]
    kinds = [[type(x) for x in m.modules()] for m in models]
    if any(s != shapes[0] for s in shapes) or any(k != kinds[0] for k in kinds):
        raise ValueError("cannot stack seeds: the models differ in layers or parameter shapes")
    stacked = _copy_without_parameters(models[0])
    for name, leaf in _leaves(models[0]):
        layers = [m.get_submodule(name) for m in models]
        _replace(stacked, name, stacked_form(leaf)(layers))
    stacked.n_seeds = len(models)  # TransformerModel adds a per-seed PE / mask (model.py)
    return stacked


def unstack_model(stacked: TransformerModel, s: int) -> TransformerModel:
    """Seed s's single model (a copy with its own tensors), as if trained alone."""
    single = _copy_without_parameters(stacked)
    device = next(stacked.parameters()).device
    replaced: list[str] = []
    for name, leaf in stacked.named_modules():
        if hasattr(leaf, "unstack") and not any(name.startswith(f"{r}.") for r in replaced):
            _replace(single, name, leaf.unstack(s))
            replaced.append(name)
    single.__dict__.pop("n_seeds", None)
    return single.to(device)


def seed_state_dict(stacked: TransformerModel, s: int) -> dict[str, torch.Tensor]:
    """Seed s's ``state_dict`` (views, no copy), with the single model's keys and shapes."""
    state = stacked.state_dict()
    for prefix, module in stacked.named_modules():
        if isinstance(module, SeedStackedLayer):
            for name in module.single_shapes:
                state[f"{prefix}.{name}" if prefix else name] = module.seed_slice(name, s)
    return state


def stacked_param_groups(stacked: TransformerModel, weight_decay: float) -> list[dict]:
    """``adamw_param_groups`` of the single model, over the stacked tensors: weight decay on
    those that are matrices in the single model (not biases, gains), one group when it is 0."""
    single_dims = {id(getattr(m, name)): len(shape) for m in stacked.modules()
                   if isinstance(m, SeedStackedLayer) for name, shape in m.single_shapes.items()}
    params = [p for p in stacked.parameters() if p.requires_grad]
    if not weight_decay:
        return [{"params": params, "weight_decay": 0.0}]
    return [{"params": [p for p in params if single_dims[id(p)] >= 2],
             "weight_decay": weight_decay},
            {"params": [p for p in params if single_dims[id(p)] < 2], "weight_decay": 0.0}]


# On CPU, log-softmax over fewer classes than this runs as scalar code per row (a vocabulary of
# 10, the reverse task's: 8192 rows took 1.8 ms forward + backward); over the transposed layout
# it is vectorised across rows (0.42 ms), with the same values (the gradients within 1e-7).
NARROW_VOCAB = 16


def seed_losses(logits: torch.Tensor, targets: torch.Tensor, n_seeds: int) -> torch.Tensor:
    """Each seed's mean cross-entropy over its scored positions (``sequence_loss`` per seed):
    logits (S*B, T, V), targets (S*B, T) -> (S,)."""
    flat = logits.float().flatten(0, 1)  # (S*B*T, V)
    if flat.shape[-1] < NARROW_VOCAB and flat.device.type == "cpu":
        log_probs = flat.t().log_softmax(dim=0).t()  # (S*B*T, V), see NARROW_VOCAB
        per_token = F.nll_loss(log_probs, targets.flatten(), ignore_index=IGNORE_INDEX,
                               reduction="none")  # (S*B*T,)
    else:
        per_token = F.cross_entropy(flat, targets.flatten(), ignore_index=IGNORE_INDEX,
                                    reduction="none")  # (S*B*T,)
    scored = (targets != IGNORE_INDEX).view(n_seeds, -1).sum(dim=1)  # (S,)
    return per_token.view(n_seeds, -1).sum(dim=1) / scored  # (S,)


def clip_seed_gradients(params: Sequence[torch.Tensor], max_norm: float,
                        n_seeds: int) -> torch.Tensor:
    """Per-seed ``clip_gradients``: seed s's total norm ||(g_1[s], ..., g_n[s])||_2 over its own
    slices (the same number as the single run's norm of per-tensor norms, up to rounding), and
    its slices scaled by min(1, max_norm / (norm_s + 1e-6)); returns (S,)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(n_seeds)
    flat = torch.cat([g.view(n_seeds, -1) for g in grads], dim=1)  # (S, N): one row per seed
    total = torch.linalg.vector_norm(flat, dim=1)  # (S,), one kernel instead of P
    if math.isfinite(max_norm):
        coef = (max_norm / (total + 1e-6)).clamp_(max=1.0)  # (S,)
        views = {d: coef.view(-1, *[1] * (d - 1)) for d in {g.dim() for g in grads}}
        torch._foreach_mul_(grads, [views[g.dim()] for g in grads])  # g[s] *= coef[s]
    return total


class SeedStackedTrainer:
    """``Trainer.train_step`` for a stacked model: the same schedule, clipping (per seed) and
    AdamW (one over the stacked tensors); the batches come from the caller (seed s's as a run
    with seed s draws them: ``seed_batches.SeedBatches``)."""

    def __init__(self, model: TransformerModel, train: DictConfig, d_model: int,
                 seeds: Sequence[int]) -> None:
        if len(seeds) != model.n_seeds:
            raise ValueError(f"{len(seeds)} seeds for a model of {model.n_seeds}")
        self.model, self.seeds, self.d_model = model, list(seeds), d_model
        self.device = torch.device(train.device)
        model.to(self.device)
        self.schedule = SCHEDULES[train.schedule]
        self._train = PlainConfig(train)
        self.params = [p for p in model.parameters() if p.requires_grad]
        groups = stacked_param_groups(model, float(train.weight_decay))
        self.horizon = int(train.steps)
        lr = self.schedule(1, self._train, d_model, self.horizon)
        self.optimizer = make_adamw(groups, lr, tuple(train.betas))
        self.grad_clip = float(train.grad_clip) if train.grad_clip else math.inf
        self.autocast = (torch.autocast(self.device.type, dtype=torch.bfloat16)
                         if train.precision == "bf16" else nullcontext())
        self.step_count = 0
        self.forward = model  # or its compiled form (``training/compile.py``)

    def plan_schedule(self, steps: int) -> None:
        """The schedule ends ``steps`` steps from now (``Trainer.plan_schedule``)."""
        self.horizon = self.step_count + int(steps)

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step of every seed (``batch``: (S, B, T) tensors, row k seed k's);
        returns the losses (S,) and gradient norms (S,) as tensors (no host sync) and the
        learning rate."""
        self.step_count += 1
        lr = self.schedule(self.step_count, self._train, self.d_model, self.horizon)
        set_lr(self.optimizer, lr)
        if not self.model.training:
            self.model.train()
        inputs = batch.inputs.flatten(0, 1).to(self.device)  # (S*B, T), seed-major
        targets = batch.targets.flatten(0, 1).to(self.device)  # (S*B, T)
        n_seeds = len(self.seeds)
        with self.autocast:
            losses = seed_losses(self.forward(inputs), targets, n_seeds)  # (S,)
        for param in self.params:
            param.grad = None
        losses.sum().backward()  # the seeds share no weights: each gets its own gradient
        norms = clip_seed_gradients(self.params, self.grad_clip, n_seeds)
        self.optimizer.step()
        return losses.detach(), norms, lr
