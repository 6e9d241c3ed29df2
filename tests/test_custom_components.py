"""Bring your own component: the examples in examples/my_components.py through tlab validate.

Correct components pass; each broken one is caught by the step that should catch it, with a
message that points at positions (PEs) or at the protocol (exit code 2 before any file).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import assert_refused, read_csv

from transformer_lab.config.protocols import check_protocols
from transformer_lab.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
CONFIG_DIR = REPO / "examples" / "configs"
FAST = ["routine.compare.routine.steps=20", "task.eval_size=128"]


@pytest.fixture(autouse=True)
def _examples_importable(monkeypatch):
    """``_target_: examples.my_components.X`` resolves from the repository root (``tlab`` adds
    the working directory to the import path the same way)."""
    monkeypatch.syspath_prepend(str(REPO))



def validate(tlab, out, *overrides):
    return tlab("--config-dir", CONFIG_DIR, "experiment=validate", *overrides, *FAST,
                f"hydra.run.dir={out}")


def test_correct_custom_pe_ffn_and_norm_pass(tlab, tmp_path):
    out = tmp_path / "ok"
    code, stdout, _ = validate(tlab, out, "pe=my_sinusoidal", "ffn=my_ffn",
                               "norm_layer=my_rmsnorm")
    assert code == 0, stdout
    rows = read_csv(out / "validation.csv")
    assert all(r["status"] in ("PASS", "SKIP") for r in rows)
    param_count = next(r for r in rows if r["check"] == "param_count")
    assert param_count["status"] == "SKIP"  # no formula for a user's own FFN
    chosen = read_csv(out / "reverse.csv")[0]
    assert chosen["pe"] == "MySinusoidalPE" and chosen["solved"] == "True"


def test_position_blind_pe_fails_at_step_1(tlab, tmp_path):
    """Step 1's position_injectivity catches it before any training (it used to take step 3's
    reversal); the later steps are not run."""
    out = tmp_path / "blind"
    code, stdout, _ = validate(tlab, out, "pe=position_blind", "routine.max_steps=30")
    assert code == 1
    rows = read_csv(out / "validation.csv")
    failed = [r for r in rows if r["status"] == "FAIL"]
    assert [(r["step"], r["check"]) for r in failed] == [
        ("1", "position_injectivity"), ("1", "position_distinguishability")]  # both see it
    assert "positions 0 and 1 get the same representation" in failed[0]["detail"]
    assert all(r["status"] == "SKIP" for r in rows if r["step"] in ("2", "3", "4"))
    assert "step 1 failed" in stdout


def test_rope_with_mismatched_pairing_fails_at_step_3(tlab, tmp_path):
    out = tmp_path / "mismatch"
    code, _, _ = validate(tlab, out, "pe=mismatched_rope", "routine.max_steps=40",
                          "routine.control=false")
    assert code == 1
    rows = read_csv(out / "validation.csv")
    check = next(r for r in rows if r["check"] == "rotary_relative")
    assert check["status"] == "FAIL" and check["step"] == "3"
    assert "positions" in check["detail"] and "pairing" in check["detail"]
    assert all(r["status"] in ("PASS", "SKIP") for r in rows if r["step"] in ("1", "2"))


def test_correct_custom_rope_passes_the_relative_check(spec_for):
    from transformer_lab.config.spec import Component
    from transformer_lab.routines.check import rotary_relative_check

    spec, _ = spec_for("experiment=reverse_task", "pe=rope")
    pe = Component("pe", {"name": "my_rope", "_target_": "examples.my_components.MyRoPE",
                          "head_dim": 8})
    assert rotary_relative_check(replace(spec, model=replace(spec.model, pe=pe))).status == "PASS"


@pytest.mark.parametrize(("overrides", "message"), [
    (["ffn=wrong_shape_ffn"], "an FFN must map (B, T, d_model) -> (B, T, d_model)"),
    (["pe._target_=examples.my_components.NoSuchPE"], "NoSuchPE"),
    (["pe._target_=no_such_package.MyPE"], "no_such_package"),
    (["pe=my_ropee"], "unknown pe 'my_ropee'; valid: alibi, learned, mismatched_rope, my_rope"),
    (["routine.compare.routine.activations=[relu,my_fnn]"], "valid: geglu, gelu, gelu_tanh, "
     "leaky_relu, moe, my_ffn"),
])
def test_components_that_do_not_plug_in_exit_2(tlab, tmp_path, overrides, message):
    """Checked before the run starts, with the user's --config-dir searched as Hydra does."""
    out = tmp_path / "bad"
    assert_refused(validate(tlab, out, *overrides), out, message)


def test_missing_config_dir_exits_2(tlab, tmp_path):
    out = tmp_path / "out"
    assert_refused(tlab("--config-dir", tmp_path / "nowhere", "experiment=validate",
                        f"hydra.run.dir={out}"), out, "--config-dir", "nowhere")


def test_compare_activations_takes_an_ffn_from_the_users_config_dir(tlab, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = tlab("--config-dir", CONFIG_DIR, "experiment=compare_activations",
                             "routine.activations=[relu,my_ffn]", "routine.steps=6",
                             "model=tiny", "task.eval_size=32", f"hydra.run.dir={out}")
    assert code == 0, err
    rows = read_csv(out / "comparison.csv")
    assert [r["activation"] for r in rows] == ["relu", "my_ffn"]


def test_protocol_checks_name_the_component(spec_for):
    from torch import nn

    from transformer_lab.model import build_model

    spec, task = spec_for("experiment=reverse_task", "pe=sinusoidal")
    model, seq_len = build_model(spec.model), task.model_seq_len
    check_protocols(spec.model, model, seq_len)  # the built-in components follow it

    class FlatAdditive(nn.Module):
        kind = "additive"

        def forward(self, positions):
            return torch.zeros(len(positions))  # (T,) instead of (T, d_model)

    model.positional = FlatAdditive()
    with pytest.raises(ConfigError, match=r"FlatAdditive.*\(T, d_model\)"):
        check_protocols(spec.model, model, seq_len)

    class OneTensorRotary(nn.Module):
        kind = "rotary"

        def forward(self, q, k, positions):
            return q

    model.positional = OneTensorRotary()
    with pytest.raises(ConfigError, match=r"OneTensorRotary.*\(q, k\)"):
        check_protocols(spec.model, model, seq_len)

    class WrongBias(nn.Module):
        kind = "bias"

        def forward(self, q_len, k_len):
            return torch.zeros(q_len, k_len)

    model.positional = WrongBias()
    with pytest.raises(ConfigError, match=r"WrongBias.*\(n_heads, T, T\)"):
        check_protocols(spec.model, model, seq_len)
