"""The stacked layers' fast paths give each seed its single layer's numbers: LayerNorm on both
sides of ``PER_SEED_KERNELS_MIN`` (one call plus a broadcast affine, or one fused call per
seed), and Linear with its weights stored as W_s^T."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer_lab.components import seed_stacked
from transformer_lab.training.seed_stack_layers import SeedStackedLayerNorm, SeedStackedLinear

SEEDS = 3


def check_seeds(singles, stacked, x_rows: torch.Tensor, rows: int) -> None:
    """Stacked output and gradients of each seed against its single layer, on ``x_rows``
    (S*B, T, D) where seed s owns rows s*rows .. s*rows + rows - 1."""
    x = x_rows.clone().requires_grad_(True)
    out = stacked(x)
    grad = torch.randn_like(out)
    out.backward(grad)
    for s, single in enumerate(singles):
        part = x_rows[s * rows:(s + 1) * rows].clone().requires_grad_(True)
        alone = single(part)
        alone.backward(grad[s * rows:(s + 1) * rows])
        torch.testing.assert_close(out[s * rows:(s + 1) * rows], alone, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(x.grad[s * rows:(s + 1) * rows], part.grad,
                                   rtol=1e-5, atol=1e-6)
        for name, param in single.named_parameters():
            torch.testing.assert_close(stacked.seed_grad(name, s), param.grad,
                                       rtol=1e-5, atol=1e-5, msg=f"seed {s} grad {name}")


@pytest.mark.parametrize("rows, bias", [(2, True), (64, True), (64, False)])
def test_stacked_layernorm_small_and_per_seed_paths_equal_single_layers(rows, bias):
    torch.manual_seed(0)
    dim, seq = 64, 16  # 64 rows x 16 x 64 = 65,536 elements per seed: the per-seed path
    singles = [nn.LayerNorm(dim, bias=bias) for _ in range(SEEDS)]
    with torch.no_grad():
        for layer in singles:
            layer.weight.normal_()
            if bias:
                layer.bias.normal_()
    stacked = SeedStackedLayerNorm(singles)
    per_seed = rows * seq * dim >= seed_stacked.PER_SEED_KERNELS_MIN
    assert per_seed == (rows == 64)
    check_seeds(singles, stacked, torch.randn(SEEDS * rows, seq, dim), rows)


def test_stacked_linear_stores_transposed_weights_and_gives_back_single_ones():
    torch.manual_seed(0)
    singles = [nn.Linear(8, 24) for _ in range(SEEDS)]
    stacked = SeedStackedLinear(singles)
    assert stacked.weight.shape == (SEEDS, 8, 24) and stacked.weight.is_contiguous()
    check_seeds(singles, stacked, torch.randn(SEEDS * 4, 5, 8), 4)
    for s, single in enumerate(singles):
        assert torch.equal(stacked.seed_slice("weight", s), single.weight)
        back = stacked.unstack(s)
        assert back.weight.is_contiguous() and torch.equal(back.weight, single.weight)
        assert torch.equal(back.bias, single.bias)


@pytest.mark.parametrize("vocab", [10, 40])  # below NARROW_VOCAB: the transposed log-softmax
def test_seed_losses_equal_each_seeds_own_mean_cross_entropy_and_its_gradient(vocab):
    from transformer_lab.tasks import IGNORE_INDEX
    from transformer_lab.training.seed_stack import NARROW_VOCAB, seed_losses
    from transformer_lab.training.trainer import sequence_loss

    assert (vocab < NARROW_VOCAB) == (vocab == 10)
    torch.manual_seed(0)
    rows, seq = 4, 6
    logits = (torch.randn(SEEDS * rows, seq, vocab) * 3).requires_grad_(True)
    targets = torch.randint(0, vocab, (SEEDS * rows, seq))
    targets[:, :2] = IGNORE_INDEX  # unscored positions, as in the decoder layout
    losses = seed_losses(logits, targets, SEEDS)
    losses.sum().backward()
    for s in range(SEEDS):
        part = logits[s * rows:(s + 1) * rows].detach().clone().requires_grad_(True)
        loss = sequence_loss(part, targets[s * rows:(s + 1) * rows])
        loss.backward()
        assert losses[s].item() == pytest.approx(loss.item(), rel=1e-6)
        torch.testing.assert_close(logits.grad[s * rows:(s + 1) * rows], part.grad,
                                   rtol=1e-5, atol=1e-7)
