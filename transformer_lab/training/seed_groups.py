"""The seed-stacked engine of ``multiseed.fit_seeds``: S seeds trained as seed-stacked models of
at most G seeds each (``seed_stack.stack_models``), one group after another.

Why groups. Stacking S seeds shares one step's fixed cost (Python, op dispatch, optimiser
bookkeeping) among them, which is most of a small step's time; but every activation becomes S
times larger. On a CPU, a step whose activations no longer fit the core's cache runs each seed's
arithmetic slower than a single seed does (``small`` seeds all in one stacked model: 10.3x one
seed for 8, 19.9x for 16; one after another 8.0x and 15.6x; CPU time, the ``stacked_all`` and
``sequential`` rows of ``benchmarks/multiseed.csv``). So the seeds are stacked only as far as
their activations stay small: a group of G seeds has G x tokens x d_model <= ``GROUP_MAX_WORK``
(``group_size``), G = S on CUDA (launch-bound: stack them all). Each group trains to its end
before the next starts, so one group's weights, optimiser state and activations are all the
cache holds; a group of one seed is trained by its own ``Trainer``, as a single run (a 1-seed
stacked model ran up to 4% slower in ``benchmarks/seed_groups.csv``, and rounds
differently). Stepping the groups in turn instead (every group one step, then the next step)
was 10% slower than one after another for 8 ``small`` seeds in groups of one (80.4 against
73.2 ms/step, measured once by hand): the groups then evict each other's state from the cache
every step.

Grouping does not change the numbers: a seed's slice of a batched kernel does not depend on the
other seeds in it (seed s of a group of 2 equals seed s of a group of 4, bit for bit:
``tests/test_seed_groups.py``). Each seed's own model is bound to views of its slices
(``bind_seed_views``): ``models[k]`` always holds seed k's current weights, and no second copy
is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from omegaconf import DictConfig
from torch import nn

from transformer_lab.components.seed_stacked import SeedStackedLayer
from transformer_lab.model import TransformerModel
from transformer_lab.tasks import Batch
from transformer_lab.training.compile import CompileProbe
from transformer_lab.training.seed_stack import SeedStackedTrainer, stack_models

# Tokens x d_model of a whole group, at most, on CPU. ``python -m benchmarks.seed_groups``
# (``benchmarks/seed_groups.csv``): 8 seeds, CPU ms/step in groups of 8 / 4 / 2 / 1 against one
# after another, per-seed work 4096: 6.8 / 8.4 / 11.9 / 16.1 vs 15.8; 16384: 18.6 / 19.0 / 22.6 /
# 27.5 vs 26.5; 32768: 36.7 / 34.2 / 37.3 / 40.3 vs 40.9; 65536 (``small``): 83.9 / 71.6 / 67.6 /
# 69.0 vs 68.9. On the quiet machine the best group holds ~131k; a first run by hand while
# another job ran put it at 32k-65k (65536: groups of 2 74.9 vs 73.4 one after another). 65536 is
# kept: at most 2% slower than the best for ``small`` (8% at 32768), and a ``small`` seed then
# trains as its own single run, with exactly its numbers (the studies in ``experiments/``).
GROUP_MAX_WORK = 65536


def group_size(work: int, n_seeds: int, device: str) -> int:
    """Seeds per stacked group for a step of ``work`` = tokens x d_model per seed."""
    if str(device).startswith("cuda"):
        return n_seeds
    return max(1, min(n_seeds, GROUP_MAX_WORK // max(work, 1)))


def seed_groups(n_seeds: int, size: int) -> list[range]:
    """Rows 0..n_seeds-1 in consecutive groups of ``size`` (the last one may be smaller)."""
    return [range(start, min(start + size, n_seeds)) for start in range(0, n_seeds, size)]


def bind_seed_views(stacked: TransformerModel, models: Sequence[nn.Module]) -> None:
    """Point each single model's tensors at its seed's slices of ``stacked`` (views, no copy):
    ``models[k]`` then always holds seed k's current weights and BatchNorm statistics, for
    evaluation and for the caller, and no second copy of the weights is kept."""
    for prefix, layer in stacked.named_modules():
        if not isinstance(layer, SeedStackedLayer):
            continue
        for k, model in enumerate(models):
            single = model.get_submodule(prefix)
            for name in layer.single_shapes:
                getattr(single, name).data = layer.seed_slice(name, k).detach()


class StackedSeeds:
    """One group's engine: ``stack_models`` of the seeds' models, each model bound to its
    seed's slices (``bind_seed_views``), and ``SeedStackedTrainer.train_step`` as the step (the
    loop: ``multiseed.train_together``)."""

    def __init__(self, cfg: DictConfig, seeds: Sequence[int], models: Sequence[nn.Module],
                 trainers: Sequence, horizon: int) -> None:
        self.stacked = stack_models(models)
        self.trainer = SeedStackedTrainer(self.stacked, cfg.train, cfg.model.d_model, seeds)
        self.trainer.plan_schedule(horizon)
        self.trainers = trainers  # each seed's Trainer: its step count, rows and evaluations
        bind_seed_views(self.stacked, models)

    def step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step of every seed (``batch``: (S, B, T), row k seed k's): losses
        (S,), gradient norms (S,) and the learning rate."""
        for trainer in self.trainers:
            trainer.step_count += 1
        return self.trainer.train_step(batch)

    def compile_probe(self, steps: int) -> CompileProbe:
        """``train.compile=true``: compile the stacked model's forward where it pays."""
        first = self.trainers[0]
        return CompileProbe(self.stacked, steps, first.step_work(), str(first.device),
                            f"the {len(self.trainers)}-seed stacked step",
                            lambda forward: setattr(self.trainer, "forward", forward))
