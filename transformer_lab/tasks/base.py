"""What a task gives the training loop: batches of (inputs, targets), ``IGNORE_INDEX`` where not
scored, and a held-out set."""

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

    @abstractmethod
    def eval_batch(self) -> Batch:
        """The fixed held-out batch (never drawn by ``train_batch``)."""

    def exact_match(self, model: nn.Module, batch: Batch) -> float | None:
        """Fraction of sequences predicted entirely right; None where it does not apply."""
        return None
