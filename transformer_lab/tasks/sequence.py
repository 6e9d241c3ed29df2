"""Sequence-to-sequence toy tasks, reverse and copy: an encoder predicts target i at position i, a
decoder reads ``source SEP target`` and is scored on the target (docs/data.md)."""

from __future__ import annotations

import torch
from torch import nn

from transformer_lab.tasks.base import IGNORE_INDEX, Batch, Task

SEP = 0  # token id 0 separates source and target; symbols are 1 .. vocab_size - 1


class SequenceTransformTask(Task):
    """Map a random symbol sequence to ``transform(sequence)``; subclasses define transform."""

    def __init__(self, seq_len: int, vocab_size: int, causal: bool, eval_size: int = 512,
                 holdout_mod: int = 10, data_seed: int = 1234) -> None:
        if seq_len < 2:
            raise ValueError(f"task.seq_len={seq_len} is too short; it must be at least 2")
        if vocab_size < 3:
            raise ValueError(f"task.vocab_size={vocab_size} is too small; it must be at least 3")
        self.seq_len = seq_len
        self.vocab_size = vocab_size
        self.causal = causal
        self.holdout_mod = holdout_mod
        self.model_seq_len = 2 * seq_len if causal else seq_len
        self._place_values = (vocab_size ** torch.arange(seq_len)).to(torch.int64)  # (L,)
        held_out = self._sample(eval_size, torch.Generator().manual_seed(data_seed), held_out=True)
        self._eval = self._layout(held_out)

    def transform(self, source: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _is_held_out(self, source: torch.Tensor) -> torch.Tensor:
        """(B, L) -> (B,) bool, a fixed pseudo-random ~1/holdout_mod of all sequences."""
        code = (source.to(torch.int64) * self._place_values).sum(dim=1)  # (B,)
        return (code * 2654435761 % 4294967296) % self.holdout_mod == 0

    def _sample(self, n: int, generator: torch.Generator, held_out: bool) -> torch.Tensor:
        """n distinct-split sources (n, L) with symbols in 1 .. vocab_size - 1."""
        chunks: list[torch.Tensor] = []
        while sum(map(len, chunks)) < n:
            draw = torch.randint(1, self.vocab_size, (max(2 * n, 64), self.seq_len),
                                 generator=generator)
            chunks.append(draw[self._is_held_out(draw) == held_out])
        return torch.cat(chunks)[:n]

    def _layout(self, source: torch.Tensor) -> Batch:
        target = self.transform(source)  # (B, L)
        if not self.causal:
            return Batch(source, target)
        sep = torch.full((len(source), 1), SEP, dtype=source.dtype)
        sequence = torch.cat([source, sep, target], dim=1)  # (B, 2L+1)
        targets = sequence[:, 1:].clone()  # (B, 2L)
        targets[:, : self.seq_len] = IGNORE_INDEX
        return Batch(sequence[:, :-1], targets)

    def train_batch(self, batch_size: int, generator: torch.Generator) -> Batch:
        return self._layout(self._sample(batch_size, generator, held_out=False))

    def eval_batch(self) -> Batch:
        return self._eval

    @torch.no_grad()
    def exact_match(self, model: nn.Module, batch: Batch) -> float:
        if not self.causal:
            predicted = model(batch.inputs).argmax(dim=-1)  # (B, L)
            return (predicted == batch.targets).all(dim=1).float().mean().item()
        prefix = batch.inputs[:, : self.seq_len + 1]  # source SEP
        target = batch.targets[:, self.seq_len :]  # (B, L)
        generated = model.generate(prefix, self.seq_len)  # (B, L) greedy, not teacher-forced
        return (generated == target).all(dim=1).float().mean().item()


class ReverseTask(SequenceTransformTask):
    """Output the source sequence reversed: y_i = x_{L-1-i}."""

    def transform(self, source: torch.Tensor) -> torch.Tensor:
        return source.flip(dims=[1])


class CopyTask(SequenceTransformTask):
    """Output the source sequence unchanged: y_i = x_i (trivial for an encoder, a check for
    decoders: the target must be fetched from L+1 positions back)."""

    def transform(self, source: torch.Tensor) -> torch.Tensor:
        return source.clone()
