"""Every seed's training batches of one step as one tensor, for the batched engines.

A batched step of S seeds needs seed s's batch drawn from seed s's own generator, as a single
run with seed s draws it. Drawing S batches per step (S ``randint`` calls, S hold-out filters,
a ``torch.cat``) cost about a fifth of a tiny model's 8-seed step, so ``SeedBatches`` draws
each seed's batches ``block`` steps at a time (``Task.train_batches``: the same numbers as
per-step draws) and lays them out as (steps, S, B, T), where step i is a contiguous view
(S, B, T), seed-major as the stacked model expects, copied to the device once per block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from transformer_lab.tasks import Batch

BLOCK_STEPS = 64  # steps of batches drawn at once per seed
BLOCK_TOKENS = 1 << 20  # at most this many token ids per block (inputs; targets as many)


class SeedBatches:
    """``batches(i)``: step i's batches of every seed, inputs and targets (S, B, T).

    ``fixed``: {seed: [Batch, ...]} cycled through (step i takes ``fixed[s][i % len]``), else
    fresh batches from each trainer's ``task`` and ``generator`` (``trainers[k]`` is seed k's).
    Steps must be asked for in order (0, 1, 2, ...) when the batches are fresh."""

    def __init__(self, trainers: Sequence, seeds: Sequence[int], total_steps: int,
                 fixed: Mapping[int, Sequence[Batch]] | None, device: torch.device) -> None:
        self.trainers, self.seeds, self.device = list(trainers), list(seeds), device
        self.total_steps, self.fixed = total_steps, fixed
        self.batch_size = int(trainers[0]._train.batch_size)
        self.block: Batch | None = None  # (count, S, B, T) inputs and targets
        self.block_start = 0
        self.cycle: Batch | None = None  # fixed batches of equal length, stacked once
        if fixed is not None and len({len(fixed[s]) for s in self.seeds}) == 1:
            self.cycle = self._stack([list(fixed[s]) for s in self.seeds])

    def _stack(self, per_seed: list[list[Batch]]) -> Batch:
        """[[seed 0's batches], ...] -> Batch of (steps, S, B, T) on the device."""
        inputs = torch.stack([torch.stack([b.inputs for b in bs]) for bs in per_seed], dim=1)
        targets = torch.stack([torch.stack([b.targets for b in bs]) for bs in per_seed], dim=1)
        return Batch(inputs, targets).to(self.device)

    def _draw_block(self, start: int) -> None:
        """Draw steps ``start ..`` of every seed from its own generator (one block)."""
        tokens = len(self.seeds) * self.batch_size * self.trainers[0].task.model_seq_len
        count = min(BLOCK_STEPS, max(1, BLOCK_TOKENS // max(tokens, 1)),
                    self.total_steps - start)
        drawn = [t.task.train_batches(self.batch_size, t.generator, count)
                 for t in self.trainers]  # each (count, B, T)
        self.block = Batch(torch.stack([d.inputs for d in drawn], dim=1),
                           torch.stack([d.targets for d in drawn], dim=1)).to(self.device)
        self.block_start = start

    def __call__(self, i: int) -> Batch:
        if self.cycle is not None:
            k = i % len(self.cycle.inputs)
            return Batch(self.cycle.inputs[k], self.cycle.targets[k])  # (S, B, T)
        if self.fixed is not None:  # lengths differ: stack this step's
            step = [[self.fixed[s][i % len(self.fixed[s])]] for s in self.seeds]
            stacked = self._stack(step)
            return Batch(stacked.inputs[0], stacked.targets[0])
        if self.block is None or not (0 <= i - self.block_start < len(self.block.inputs)):
            if i != (0 if self.block is None else self.block_start + len(self.block.inputs)):
                raise ValueError(f"fresh batches are drawn in order: step {i} asked for")
            self._draw_block(i)
        k = i - self.block_start
        return Batch(self.block.inputs[k], self.block.targets[k])  # (S, B, T)
