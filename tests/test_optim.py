"""tlab's AdamW against torch.optim.AdamW, step by step (the independent reference)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from transformer_lab.training import optim
from transformer_lab.training.optim import adamw_param_groups


def _params(seed: int) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*shape)) for shape in [(6, 4), (4,), (3, 6), (3,)]]


def _run(make, fused: bool, steps: int = 12) -> list[torch.Tensor]:
    params = _params(0)
    groups = adamw_param_groups(params, weight_decay=0.1)
    opt = make(groups)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        lr = 1e-2 if step < 6 else 3e-3  # a schedule changes group["lr"] between steps
        for group in opt.param_groups:
            group["lr"] = lr
        for i, p in enumerate(params):
            # step 3 leaves one parameter without a gradient: it must be skipped, not decayed
            p.grad = None if (step == 3 and i == 1) else torch.randn(p.shape, generator=gen)
        if not fused:
            with _no_fused_kernel():
                opt.step()
        else:
            opt.step()
    return [p.detach().clone() for p in params]


class _no_fused_kernel:
    def __enter__(self):
        self.saved = optim._has_fused_kernel
        optim._has_fused_kernel = lambda params: False

    def __exit__(self, *exc):
        optim._has_fused_kernel = self.saved


@pytest.mark.parametrize("fused", [True, False], ids=["fused-kernel", "foreach-fallback"])
def test_adamw_matches_torch_optim(fused: bool):
    ours = _run(lambda groups: optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98)), fused)
    reference = _run(lambda groups: torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.98),
                                                      foreach=False), fused=True)
    start = _params(0)
    for mine, theirs, before in zip(ours, reference, start, strict=True):
        assert not torch.equal(mine, before)  # it moved
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-7)


def test_training_does_not_import_dynamo():
    """The reason for optim.AdamW: a training step must not pull in torch._dynamo (~1.5 s)."""
    code = ("import sys, torch; from transformer_lab.training.optim import AdamW; "
            "p = torch.nn.Parameter(torch.ones(3)); p.grad = torch.ones(3); "
            "AdamW([{'params': [p]}], lr=0.1).step(); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"
