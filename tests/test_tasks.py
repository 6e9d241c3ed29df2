"""Tasks: layouts, held-out split, determinism; schedules: the formulas."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from transformer_lab.tasks import (
    IGNORE_INDEX,
    CopyTask,
    ReverseTask,
    SyntheticLanguageTask,
    TextTask,
)
from transformer_lab.tasks.sequence import SEP
from transformer_lab.training.schedules import SCHEDULES
from transformer_lab.training.trainer import TrainSettings


def test_encoder_reverse_layout():
    task = ReverseTask(seq_len=5, vocab_size=10, causal=False)
    batch = task.train_batch(16, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (16, 5) and task.model_seq_len == 5
    assert torch.equal(batch.targets, batch.inputs.flip(1))
    assert batch.inputs.min() >= 1  # token 0 is reserved for SEP


def test_decoder_reverse_layout_scores_only_the_target():
    task = ReverseTask(seq_len=4, vocab_size=10, causal=True)
    batch = task.train_batch(8, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (8, 8) and task.model_seq_len == 8
    source = batch.inputs[:, :4]
    assert torch.all(batch.inputs[:, 4] == SEP)
    assert torch.all(batch.targets[:, :4] == IGNORE_INDEX)
    assert torch.equal(batch.targets[:, 4:], source.flip(1))
    assert torch.equal(batch.inputs[:, 5:], source.flip(1)[:, :3])  # teacher forcing shift


def test_copy_targets_equal_inputs():
    task = CopyTask(seq_len=4, vocab_size=7, causal=False)
    batch = task.train_batch(8, torch.Generator().manual_seed(1))
    assert torch.equal(batch.inputs, batch.targets)


def test_held_out_sequences_never_appear_in_training():
    task = ReverseTask(seq_len=3, vocab_size=6, causal=False, eval_size=64)
    held_out = {tuple(row) for row in task.eval_batch().inputs.tolist()}
    generator = torch.Generator().manual_seed(0)
    seen = {tuple(r) for _ in range(50) for r in task.train_batch(64, generator).inputs.tolist()}
    assert held_out and not held_out & seen
    assert len(seen) > 80  # most of the 125 sequences are drawn, minus the held-out ones


def test_exact_match_of_a_perfect_model_is_one():
    task = ReverseTask(seq_len=4, vocab_size=10, causal=False, eval_size=32)

    class Oracle(torch.nn.Module):
        def forward(self, tokens):
            return torch.nn.functional.one_hot(tokens.flip(1), 10).float()

    assert task.exact_match(Oracle(), task.eval_batch()) == 1.0


def test_synthetic_lm_is_deterministic_and_learnable_structure():
    a = SyntheticLanguageTask(seq_len=16, vocab_size=32, n_chains=16, chain_len=64, data_seed=7)
    b = SyntheticLanguageTask(seq_len=16, vocab_size=32, n_chains=16, chain_len=64, data_seed=7)
    assert np.array_equal(a.train_tokens, b.train_tokens)
    batch = a.train_batch(4, torch.Generator().manual_seed(0))
    assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
    # each token has at most `branching` successors
    pairs = np.stack([a.train_tokens[:-1], a.train_tokens[1:]], 1).tolist()
    successors = {}
    for x, y in pairs:
        successors.setdefault(x, set()).add(y)
    # chains are concatenated, so chain boundaries add a few extra pairs
    assert sorted(len(s) for s in successors.values())[len(successors) // 2] <= 4
    assert 0 < a.entropy_rate < math.log(4) + 1e-9


def test_text_task(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("hello world, " * 50, encoding="utf-8")
    task = TextTask(path=str(path), seq_len=8)
    assert task.vocab_size == len(set("hello world, "))
    batch = task.train_batch(3, torch.Generator().manual_seed(0))
    assert batch.inputs.shape == (3, 8)
    with pytest.raises(ValueError, match="fewer than task.seq_len"):
        TextTask(path=str(path), seq_len=200)


def _train_cfg(d_model: int = 512, **kw):
    base = {"lr": 1e-3, "warmup": 4000, "noam_factor": 1.0, "steps": 100, "min_lr_ratio": 0.1}
    return TrainSettings.from_mapping({**base, **kw}, d_model=d_model)


def test_noam_is_vaswani_equation_3():
    cfg = _train_cfg()
    for step in (1, 100, 4000, 10000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        assert SCHEDULES["noam"](step, cfg, 20000) == pytest.approx(expected)
    peak = max(range(1, 20000, 50), key=lambda s: SCHEDULES["noam"](s, cfg, 20000))
    assert abs(peak - 4000) <= 50


def test_warmup_cosine_shape():
    cfg = _train_cfg(d_model=8, warmup=10, steps=110)
    lr = [SCHEDULES["warmup_cosine"](s, cfg, 110) for s in range(1, 111)]
    assert lr[4] == pytest.approx(0.5e-3) and lr[9] == pytest.approx(1e-3)
    assert lr[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lr[9:], lr[10:], strict=False))
