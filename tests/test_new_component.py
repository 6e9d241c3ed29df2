"""A new PE is one class plus one YAML file (issue 12, item 3).

The class declares what tlab needs to know about it (its parameter count, the property checks
that apply, what it is expected to do on reversal); written into a temporary package and config
dir, it runs through ``validate``, ``check``, ``budget`` and ``plot-pe`` with no file of tlab
touched, and each command uses what the class declares.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import read_csv

from transformer_lab.config.tree import CONFIG_DIR

EXPECTED = "solves (a sinusoidal table times one learned scalar)"

MODULE = f'''"""Scaled sinusoidal PE (Hua et al. 2022, FLASH, arXiv:2202.10447): the fixed
sinusoidal table of Vaswani et al. 2017 times one learned scalar gain."""

import math

import torch
from torch import nn


class ScaledSinusoidalPE(nn.Module):
    kind = "additive"

    # what tlab needs to know about it
    property_checks = ("sinusoidal_shift", "permutation")
    expected_reversal = {{"encoder": "{EXPECTED}", "decoder": "solves"}}

    @classmethod
    def count_parameters(cls, learned_scale: bool = True) -> int:
        """The scalar gain, when it is learned."""
        return 1 if learned_scale else 0

    def __init__(self, d_model: int, base: float = 10000.0, learned_scale: bool = True) -> None:
        super().__init__()
        self.d_model, self.base = d_model, float(base)
        scale = torch.ones(())
        if learned_scale:
            self.scale = nn.Parameter(scale)
        else:
            self.register_buffer("scale", scale)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        d = self.d_model
        angles = positions.float()[:, None] * torch.exp(  # (T, ceil(d/2))
            torch.arange(0, d, 2, device=positions.device).float() * (-math.log(self.base) / d))
        table = torch.zeros(len(positions), d, device=positions.device)  # (T, d)
        table[:, 0::2] = torch.sin(angles)
        table[:, 1::2] = torch.cos(angles[:, : d // 2])
        return self.scale * table
'''

YAML = """\
# Scaled sinusoidal PE: the sinusoidal table times one learned scalar.
name: scaled_sinusoidal
_target_: scaled_sinusoidal.ScaledSinusoidalPE
d_model: ${model.d_model}
base: 10000.0
learned_scale: true
"""

SMALL = ["model.d_model=32", "model.n_heads=4", "model.d_ff=64"]


@pytest.fixture
def new_pe(tmp_path, monkeypatch) -> Path:
    """The two files of a new PE: ``scaled_sinusoidal.py`` (importable) and its config dir."""
    package = tmp_path / "package"
    package.mkdir()
    (package / "scaled_sinusoidal.py").write_text(MODULE)
    conf = tmp_path / "conf"
    (conf / "pe").mkdir(parents=True)
    (conf / "pe" / "scaled_sinusoidal.yaml").write_text(YAML)
    monkeypatch.syspath_prepend(str(package))
    assert not (CONFIG_DIR / "pe" / "scaled_sinusoidal.yaml").exists()  # nothing in tlab
    return conf


def run(tlab, conf: Path, out: Path, *overrides: str) -> tuple[int, str, str]:
    return tlab(*overrides, "--config-dir", conf, "pe=scaled_sinusoidal", f"hydra.run.dir={out}")


def test_budget_counts_the_new_pe_by_its_own_formula(tlab, new_pe, tmp_path):
    out = tmp_path / "budget"
    code, stdout, _ = run(tlab, new_pe, out, "experiment=budget", *SMALL, "routine.seq_len=16")
    assert code == 0, stdout
    (row,) = [r for r in read_csv(out / "budget.csv")
              if r["section"] == "parameters" and r["component"] == "positional"]
    assert row["formula"] == "pe=scaled_sinusoidal"
    assert (row["expected"], row["measured"], row["status"]) == ("1", "1", "PASS")
    total = next(r for r in read_csv(out / "budget.csv") if r["component"] == "total")
    assert total["status"] == "PASS"


def test_check_runs_the_checks_the_new_pe_declares(tlab, new_pe, tmp_path):
    out = tmp_path / "check"
    code, stdout, _ = run(tlab, new_pe, out, "experiment=check", "routine.pe=scaled_sinusoidal")
    assert code == 0, stdout
    rows = read_csv(out / "checks.csv")
    assert [r["check"] for r in rows] == ["sinusoidal_shift", "pe_breaks_permutation",
                                          "swap_attention"]
    assert all(r["status"] == "PASS" for r in rows)
    assert rows[0]["component"] == "pe=scaled_sinusoidal (at init)"  # its gain is learned


def test_plot_pe_draws_the_new_pe(tlab, new_pe, tmp_path):
    out = tmp_path / "plot"
    code, stdout, _ = run(tlab, new_pe, out, "experiment=plot_pe")
    assert code == 0, stdout
    assert (out / "pe_curves.png").is_file() and (out / "pe_heatmap.png").is_file()
    assert len(read_csv(out / "pe_values.csv")) == 100


def test_validate_passes_with_the_new_pe_and_shows_its_expectation(tlab, new_pe, tmp_path):
    out = tmp_path / "validate"
    code, stdout, _ = run(tlab, new_pe, out, "experiment=validate",
                          "routine.compare.routine.steps=20", "task.eval_size=128")
    assert code == 0, stdout
    rows = read_csv(out / "validation.csv")
    assert all(r["status"] in ("PASS", "SKIP") for r in rows), rows
    param_count = next(r for r in rows if r["check"] == "param_count")
    assert param_count["status"] == "PASS"  # the formula includes the PE's declared count
    chosen = next(r for r in read_csv(out / "reverse.csv") if r["role"] == "chosen")
    assert chosen["pe"] == "ScaledSinusoidalPE" and chosen["solved"] == "True"
    assert chosen["expected"] == EXPECTED
