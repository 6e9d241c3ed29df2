"""Your own components tested in your own pytest suite, with tlab's checks as assertions.

Run from the repository root: ``pytest examples/`` (the project's CI runs it: pyproject's
``testpaths``). The components are in ``my_components.py`` next to this file; the last tests
define theirs inline, as a notebook would (no importable module path needed).
"""

from __future__ import annotations

import pytest
import torch
from my_components import (
    MismatchedRoPE,
    MyFFN,
    MyRMSNorm,
    MyRoPE,
    MySinusoidalPE,
    PositionBlindPE,
)
from torch import nn

import transformer_lab as tl
from transformer_lab.testing import (
    assert_positional_encoding,
    assert_rope_relative,
    assert_trains,
)


def test_my_sinusoidal_pe_passes_the_validation_routine():
    assert_positional_encoding(MySinusoidalPE, arch="encoder")


def test_my_rope_scores_depend_on_relative_position_only():
    assert_rope_relative(MyRoPE)


def test_a_rope_with_mismatched_pairings_is_caught():
    with pytest.raises(AssertionError, match="same pairing half/interleaved"):
        assert_rope_relative(MismatchedRoPE)


def test_a_pe_that_ignores_positions_is_caught():
    with pytest.raises(AssertionError) as failure:
        assert_positional_encoding(PositionBlindPE, arch="encoder")
    message = str(failure.value)  # the failing rows, what to look at, the run directory
    assert message.startswith("pe=PositionBlindPE (arch=encoder): tlab validate failed")
    assert "same representation" in message or "no better than no PE" in message
    assert "run directory:" in message


def test_my_ffn_and_norm_train():
    assert_trains(ffn=MyFFN, norm_layer=MyRMSNorm)


class HalfScaleFFN(nn.Module):
    """Defined here like in a notebook cell: 0.5 * down(gelu(up(x))), (B, T, D) -> (B, T, D)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * self.down(nn.functional.gelu(self.up(x)))


def test_notebook_component_through_the_api(tmp_path):
    result = tl.smoke(ffn=HalfScaleFFN, out=tmp_path / "smoke")
    assert result.passed, result.table
    assert result.summary.activation[0] == "HalfScaleFFN"
    assert (result.run_dir / "config.yaml").is_file()

    compared = tl.compare_activations(["relu", HalfScaleFFN], steps=20,
                                      out=tmp_path / "compare")
    assert list(compared.table.activation) == ["relu", "HalfScaleFFN"]
    assert compared.table.final_loss.notna().all()


def test_an_instance_with_its_own_weights(tmp_path):
    pe = MySinusoidalPE(d_model=8)  # sized for smoke's tiny model (d_model 8)
    result = tl.smoke(pe=pe, out=tmp_path / "run")
    assert result.passed and result.summary.pe[0] == "MySinusoidalPE"
