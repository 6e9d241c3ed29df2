"""What a task gives the training loop: batches of (inputs, targets) and a held-out set.

Targets use ``IGNORE_INDEX`` (-100, the ``F.cross_entropy`` default) at positions that are not
scored, e.g. the source half of a decoder's ``source SEP target`` sequence.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn

IGNORE_INDEX = -100


@dataclass
class Batch:
    inputs: torch.Tensor  # (B, T) token ids fed to the model
    targets: torch.Tensor  # (B, T) token ids to predict, IGNORE_INDEX where not scored

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device), self.targets.to(device))


class Task(ABC):
    """A data source: ``vocab_size`` (model vocabulary), ``model_seq_len`` (input length T)."""

    vocab_size: int
    model_seq_len: int

    @abstractmethod
    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A fresh training batch drawn with ``generator``."""

    def train_batches(self, batch_size: int, generator: torch.Generator, count: int) -> Batch:
        """``count`` consecutive ``train_batch`` draws as one Batch of (count, B, T) tensors:
        the same numbers, and the same generator state after, as ``count`` calls. Tasks
        override it with one vectorised draw (a seed-batched run draws many steps at once)."""
        batches = [self.train_batch(batch_size, generator) for _ in range(count)]
        return Batch(torch.stack([b.inputs for b in batches]),
                     torch.stack([b.targets for b in batches]))  # (count, B, T) each

    @abstractmethod
    def eval_batch(self) -> Batch:
        """The fixed held-out batch (never drawn by ``train_batch``)."""

    def exact_match(self, model: nn.Module, batch: Batch) -> float | None:
        """Fraction of sequences predicted entirely right; None where it does not apply."""
        return None
