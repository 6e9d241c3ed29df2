"""The Python API (``import transformer_lab as tl``) and ``transformer_lab.testing``: the same
runs and files as the CLI, components defined anywhere, the CLI's messages."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import torch
from torch import nn

import transformer_lab as tl
from transformer_lab.errors import ConfigError
from transformer_lab.testing import assert_rope_relative, assert_trains

TIMING = {"wall_s", "tokens_per_s", "elapsed_s"}


def test_import_is_lazy():
    """``import transformer_lab`` loads neither the API nor torch, hydra or pandas."""
    probe = ("import sys, transformer_lab; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('torch', 'hydra', 'pandas') or m == 'transformer_lab.api'))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        _ = tl.nonesuch


def test_api_writes_what_the_cli_writes(tlab, tmp_path):
    assert tlab("experiment=smoke", "pe=rope", f"hydra.run.dir={tmp_path / 'cli'}")[0] == 0
    result = tl.smoke(pe="rope", out=tmp_path / "api")
    assert result.passed and result.exit_code == 0 and result.run_dir == tmp_path / "api"
    cli = pd.read_csv(tmp_path / "cli" / "smoke.csv")
    numbers = [c for c in cli.columns if c not in TIMING]
    pd.testing.assert_frame_equal(result.table[numbers], cli[numbers])
    assert sorted(p.name for p in result.run_dir.iterdir()) == \
        sorted(p.name for p in (tmp_path / "cli").iterdir())


class LocalPE(nn.Module):
    """An additive PE with learned frequencies, declared like a built-in."""

    kind = "additive"
    property_checks = ("permutation",)

    def __init__(self, d_model: int, scale: float) -> None:
        super().__init__()
        self.freqs = nn.Parameter(torch.linspace(1.0, 0.01, d_model) * scale)  # (d_model,)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.sin(positions.float()[:, None] * self.freqs)  # (T,) -> (T, d_model)


def test_class_arguments_come_from_the_model_or_overrides(tmp_path):
    with pytest.raises(ConfigError, match="scale"):  # no default, not a size: must be given
        tl.smoke(pe=LocalPE, out=tmp_path / "missing")
    assert not (tmp_path / "missing").exists()
    result = tl.smoke(pe=LocalPE, overrides=["pe.scale=0.5"], out=tmp_path / "run")
    assert result.passed, result.table
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "scale: 0.5" in config and "name: LocalPE" in config


def test_check_runs_the_checks_a_class_declares(tmp_path):
    result = tl.check(pe=LocalPE, overrides=["pe.scale=0.5"], out=tmp_path / "run")
    assert result.passed and set(result.table.check) >= {"pe_breaks_permutation"}


def test_bad_input_raises_the_cli_message(tmp_path):
    with pytest.raises(ConfigError, match="unknown pe 'rotary'; valid: alibi"):
        tl.validate(pe="rotary", out=tmp_path / "run")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="single runs"):
        tl.smoke(overrides=["-m"])


def test_a_failing_run_is_a_result_not_an_exception(tmp_path):
    result = tl.reverse_task(pe="none", arch="encoder", max_steps=5, out=tmp_path / "run")
    assert not result.passed and result.exit_code == 1
    assert result.table.role.tolist() == ["chosen"] and result.summary.status[0] == "failed"
    assert "failed (exit code 1)" in repr(result)


def test_testing_assertions_say_what_failed():
    class Swapped(nn.Module):  # defined in a function: no import path at all
        kind = "rotary"

        def __init__(self, head_dim: int) -> None:
            super().__init__()

        def forward(self, q, k, positions):
            from transformer_lab.components.positional import apply_rotary

            return apply_rotary(q, positions), apply_rotary(k, positions.flip(0))

    with pytest.raises(AssertionError, match=r"pe=Swapped: rotary_relative FAIL: q\.k at"):
        assert_rope_relative(Swapped)
    assert_rope_relative("rope")
    with pytest.raises(AssertionError, match="is not a rotary PE"):
        assert_rope_relative("sinusoidal")
    with pytest.raises(AssertionError, match=r"pe=none \(arch=encoder\): tlab smoke failed"):
        assert_trains(pe="none", overrides=["train.lr=1e-9"])
