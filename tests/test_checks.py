"""`tlab check`: every check passes on the real components and FAILS on a deliberately broken
one; checks.csv and the exit codes."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd
import torch
from helpers import assert_refused
from torch import nn
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.components.positional import (
    RotaryPositionalEncoding,
    apply_rotary,
    sinusoidal_table,
)
from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.measures.properties import rope_relative_violation
from transformer_lab.model import build_model
from transformer_lab.routines.check import (
    CHECK_TABLE_COLUMNS,
    check_tokens,
    equivariance_row,
    pairing_mismatch_row,
    pes_with_checks,
    rope_relative_rows,
    sinusoidal_shift_row,
    swap_row,
    trained_swap_row,
)

HEAD_DIM = 16


def check_spec(*overrides: str) -> RunSpec:
    spec = RunSpec.of(compose(["experiment=check", *overrides]))
    return spec.with_vocab(build_task(spec).vocab_size)


def model_for(*overrides: str):
    spec = check_spec(*overrides)
    return spec, build_model(spec.model, seed=0).eval()


# --------------------------------------------------------------------------------------------
# RoPE


def make_rope(base: float, style: str) -> nn.Module:
    return RotaryPositionalEncoding(HEAD_DIM, base=base, style=style)


class AbsoluteRotary(nn.Module):
    """Broken: rotates by the square of the position, so q.k depends on m and n, not n - m."""

    kind = "rotary"

    def __init__(self, base: float, style: str) -> None:
        super().__init__()
        self.base, self.style = base, style

    def forward(self, q, k, positions):
        squared = positions.float() ** 2
        return (apply_rotary(q, squared, base=self.base, style=self.style),
                apply_rotary(k, squared, base=self.base, style=self.style))


class StyleBlindRotary(RotaryPositionalEncoding):
    """Broken: ignores ``style`` (always half), so a pairing mix-up cannot be seen."""

    def __init__(self, base: float, style: str) -> None:
        super().__init__(HEAD_DIM, base=base, style="half")


def test_rope_relative_passes_for_both_pairings_and_several_bases():
    rows = rope_relative_rows(make_rope, HEAD_DIM, [100.0, 10000.0, 500000.0], "rope")
    assert len(rows) == 6 and all(r.status == "PASS" for r in rows)
    assert {r.component for r in rows} >= {"rope half base=100", "rope interleaved base=500000"}


def test_rope_relative_fails_for_an_absolute_rotation():
    rows = rope_relative_rows(AbsoluteRotary, HEAD_DIM, [10000.0], "broken")
    assert all(r.status == "FAIL" and r.value > 0.01 for r in rows)


def test_seed_example_2_5_equals_7_10():
    rope = lambda q, k, p: (apply_rotary(q, p), apply_rotary(k, p))  # noqa: E731
    assert rope_relative_violation(rope, 4, pairs=[(2, 5)], shifts=[0, 5]).value < 1e-6


def test_pairing_mismatch_is_detected_and_a_blind_detector_fails():
    row = pairing_mismatch_row(make_rope, HEAD_DIM, 10000.0, "rope")
    assert row.status == "PASS" and row.value > 0.1 and "mismatch detected" in row.detail
    blind = pairing_mismatch_row(StyleBlindRotary, HEAD_DIM, 10000.0, "broken")
    assert blind.status == "FAIL" and "did NOT break" in blind.detail


# --------------------------------------------------------------------------------------------
# sinusoidal shift


def test_sinusoidal_shift_is_linear_for_the_table_and_fails_for_broken_tables():
    table = sinusoidal_table(2048, 64)
    assert sinusoidal_shift_row(lambda p: table[p], "sinusoidal").status == "PASS"
    freqs = torch.exp(torch.arange(0, 64, 2) * (-math.log(10000.0) / 64))

    def chirp(positions):  # sin/cos of pos^1.5: no fixed linear shift map
        angles = positions.float()[:, None] ** 1.5 * freqs[None]
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)

    assert sinusoidal_shift_row(chirp, "broken").status == "FAIL"
    noise = torch.randn(2048, 64, generator=torch.Generator().manual_seed(0))
    assert sinusoidal_shift_row(lambda p: noise[p], "learned").status == "FAIL"


def test_sinusoidal_shift_passes_a_wide_correct_table():
    """d_model 2048 fits over 8192 positions, where float32 angle rounding alone leaves a
    residual of about 1.2e-3 (over the 1e-3 that suits narrow tables)."""
    table = sinusoidal_table(8192 + 10, 2048)
    row = sinusoidal_shift_row(lambda p: table[p], "sinusoidal")
    assert row.value > 1e-3 and row.status == "PASS", row


# --------------------------------------------------------------------------------------------
# permutation equivariance and the swap test


def test_nope_encoder_is_equivariant_and_a_causal_leak_fails():
    spec, model = model_for("pe=none")
    tokens = check_tokens(spec, 8)
    assert equivariance_row(model, tokens, "none", expect_equivariant=True).status == "PASS"
    assert swap_row(model, tokens, "none", expect_permuted=True).status == "PASS"
    model.causal = True  # broken: a hidden causal mask makes attention position-dependent
    assert equivariance_row(model, tokens, "none", expect_equivariant=True).status == "FAIL"
    assert swap_row(model, tokens, "none", expect_permuted=True).status == "FAIL"


def test_each_pe_breaks_equivariance_and_a_silenced_pe_fails():
    for name in ("sinusoidal", "learned", "rope", "alibi", "t5"):
        spec, model = model_for(f"pe={name}")
        tokens = check_tokens(spec, 8)
        assert equivariance_row(model, tokens, name, expect_equivariant=False).status == "PASS"
        assert swap_row(model, tokens, name, expect_permuted=False).status == "PASS", name
    spec, model = model_for("pe=sinusoidal", "model.pe_scale=0")  # broken: PE multiplied by 0
    tokens = check_tokens(spec, 8)
    assert equivariance_row(model, tokens, "x", expect_equivariant=False).status == "FAIL"
    assert swap_row(model, tokens, "x", expect_permuted=False).status == "FAIL"


def test_swap_test_after_training_on_reversal():
    for name, expect_permuted in (("none", True), ("sinusoidal", False)):
        spec = check_spec(f"pe={name}", "train.batch_size=32", "train.eval_every=20")
        spec = replace(spec, routine=spec.routine.replace(train_steps=40))
        row = trained_swap_row(spec, check_tokens(spec, 8), name)
        assert row.status == "PASS", row
        assert ("(trained)" in row.component) and "exact match" in row.detail
        assert (row.value <= 1e-5) == expect_permuted


# --------------------------------------------------------------------------------------------
# the command


def test_check_cli_writes_checks_csv(tlab, tmp_path):
    out = tmp_path / "check"
    code, stdout, _ = tlab("experiment=check", "pe=rope", "routine.pe=rope",
                           f"hydra.run.dir={out}")
    assert code == 0, stdout
    table = pd.read_csv(out / "checks.csv")
    assert list(table.columns) == CHECK_TABLE_COLUMNS
    assert (table.status == "PASS").all()
    assert set(table.check) == {"rope_relative", "rope_pairing_mismatch",
                                "pe_breaks_permutation", "swap_attention"}
    assert pd.read_csv(out / "summary.csv").loc[0, "status"] == "passed"


def test_a_failing_check_exits_1(tlab, tmp_path):
    out = tmp_path / "silenced"
    code, stdout, _ = tlab("experiment=check", "pe=sinusoidal", "routine.pe=sinusoidal",
                           "model.pe_scale=0", f"hydra.run.dir={out}")
    assert code == 1
    table = pd.read_csv(out / "checks.csv").set_index("check")
    assert table.loc["sinusoidal_shift", "status"] == "PASS"  # the table itself is fine
    assert table.loc["pe_breaks_permutation", "status"] == "FAIL"


def test_a_pe_without_checks_exits_2(tlab, tmp_path):
    # --pe also picks the pe group: an unknown name is refused there, as by every command
    result = CliRunner().invoke(app, ["check", "--pe", "rotary2", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "unknown pe 'rotary2'; valid:" in " ".join(result.output.split())
    assert not (tmp_path / "x").exists()
    assert_refused(tlab("experiment=check", "routine.pe=rotary2",
                        f"hydra.run.dir={tmp_path / 'y'}"), tmp_path / "y",
                   "--pe rotary2 has no checks; pes with checks: "
                   + ", ".join(pes_with_checks(check_spec())))


def test_check_refuses_a_decoder(tlab, tmp_path):
    assert_refused(tlab("experiment=check", "arch=decoder", "routine.pe=none",
                        f"hydra.run.dir={tmp_path / 'd'}"), tmp_path / "d", "arch=encoder")
