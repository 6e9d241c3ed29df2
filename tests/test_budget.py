"""`tlab budget`: the article's three numbers, formula vs built model for every component choice,
a mismatch is a FAIL, the activation measurement and its batch extrapolation, bad input."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from helpers import assert_refused
from torch import nn
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.config.compose import compose
from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.config.tree import group_choices
from transformer_lab.config.variants import merged, with_choice
from transformer_lab.measures.memory import saved_activation_bytes
from transformer_lab.measures.parameters import (
    attention_params,
    feedforward_params,
    ffn_activation_bytes,
    training_flops_per_token,
)
from transformer_lab.model import build_model
from transformer_lab.routines.budget import BUDGET_COLUMNS, measure_activations, parameter_rows


def budget_spec(*overrides: str) -> RunSpec:
    """The spec of ``experiment=budget`` with the budget's vocabulary (``routine.vocab_size``)."""
    spec = RunSpec.of(compose(["experiment=budget", *overrides]))
    return spec.with_vocab(spec.routine.vocab_size)


def budget_model(*overrides: str) -> ModelSpec:
    return budget_spec(*overrides).model


def row(table: pd.DataFrame, component: str, section: str = "parameters") -> pd.Series:
    found = table[(table.component == component) & (table.section == section)]
    assert len(found) >= 1, component
    return found.iloc[0]


def test_budget_defaults_reproduce_the_seed(tlab, tmp_path):
    out = tmp_path / "budget"
    code, stdout, _ = tlab("experiment=budget", f"hydra.run.dir={out}")
    assert code == 0, stdout
    table = pd.read_csv(out / "budget.csv")
    assert list(table.columns) == BUDGET_COLUMNS
    assert not (table.status == "FAIL").any()
    attention = row(table, "attention")  # d_model 768, attn_bias false
    assert attention.expected == attention.measured == 2_359_296 == 4 * 768**2
    ffn = row(table, "feedforward")  # 768 -> 3072 -> 768 with both biases
    assert ffn.expected == ffn.measured == 768 * 3072 + 3072 + 3072 * 768 + 768
    first = row(table, "ffn_hidden (first FFN activation)", "activations")
    assert first.expected == first.measured == 50_331_648 == 8 * 512 * 3072 * 4
    assert first.status == "PASS"
    flops = row(table, "weights", "flops")  # 6N, counted by torch's flop counter
    assert flops.status == "PASS" and flops.expected == flops.measured
    article = table[table.section == "article"].set_index("component")
    assert article.loc["attention Q,K,V,O without bias", "status"] == "PASS"
    assert article.loc["first FFN activation", "status"] == "PASS"
    # the source article prints 4,721,664 for the FFN with biases; its own sum is 4,722,432
    assert article.loc["FFN 768-3072-768 with biases", "expected"] == 4_721_664
    assert article.loc["FFN 768-3072-768 with biases", "measured"] == 4_722_432
    assert article.loc["FFN 768-3072-768 with biases", "status"] == "DIFF"
    share = table[(table.component == "ffn_share") & (table.scope == "per layer")].iloc[0]
    assert 66 < share.measured < 67  # the article: FFN about 2/3 of a layer
    assert "50,331,648" in stdout and "2,359,296" in stdout


def test_formulas_match_every_component_choice():
    """Each choice of each group once, on a small model: no FAIL, nothing unaccounted. Each
    choice is set by ``with_choice`` (composing 44 configs would dominate the test's time)."""
    base = budget_spec("model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.n_layers=2",
                       "routine.seq_len=16", "routine.vocab_size=50",
                       "model.gated_match_params=true")
    for group in ("pe", "block", "norm_layer", "ffn"):
        for choice in group_choices(group):
            variant = with_choice(base, group, choice)
            for bias in (True, False):
                m = merged(variant, {"model": {"attn_bias": bias, "ffn_bias": bias}}).model
                assert (m.component(group).name, m.attn_bias, m.vocab_size) == (choice, bias, 50)
                torch.manual_seed(0)
                rows = parameter_rows(m, build_model(m))
                bad = [(r.component, r.expected, r.measured) for r in rows if r.status == "FAIL"]
                assert not bad, (group, choice, bias, bad)
                assert not [r for r in rows if r.status == "SKIP"], (group, choice)


def test_a_component_that_disagrees_with_its_formula_fails():
    m = budget_model("model.d_model=32", "model.n_heads=4", "model.d_ff=64", "model.n_layers=3",
                     "routine.vocab_size=50")
    model = build_model(m)
    model.blocks[1].feedforward.extra = nn.Parameter(torch.zeros(5))  # a stray parameter
    rows = {(r.component, r.scope): r for r in parameter_rows(m, model)}
    ffn = rows[("feedforward", "layer (x3)")]
    assert ffn.status == "FAIL" and "layers [1]" in ffn.detail
    assert rows[("total", "model")].status == "FAIL"


def test_budget_exits_1_on_a_formula_mismatch(tlab, tmp_path, monkeypatch):
    import transformer_lab.routines.budget as budget

    monkeypatch.setattr(budget, "attention_projection_params",
                        lambda d, bias: {"q": d * d, "k": d * d, "v": d * d, "o": 0})
    out = tmp_path / "bad"
    code, stdout, _ = tlab("experiment=budget", "model.d_model=32", "model.n_heads=4",
                           "model.d_ff=64", "routine.measure=false", f"hydra.run.dir={out}")
    assert code == 1
    table = pd.read_csv(out / "budget.csv")
    assert set(table[table.status == "FAIL"].component) >= {"attention.o", "attention"}
    assert "FAIL" in stdout


def test_measured_activations_extrapolate_exactly_in_batch():
    """Saved bytes are affine in the batch size: batch 1 and 2 predict batch 5 exactly
    (RoPE's cos/sin rows are the batch-independent part)."""
    m = budget_model("pe=rope", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
                     "model.n_layers=2", "routine.vocab_size=50")
    torch.manual_seed(0)
    model = build_model(m)
    predicted = measure_activations(model, batch=5, seq_len=12, vocab=50, measure_batch=1)
    tokens = torch.randint(0, 50, (5, 12), generator=torch.Generator().manual_seed(3))
    direct = saved_activation_bytes(model, tokens)
    assert {k: v for k, v in predicted.items() if v} == {k: v for k, v in direct.items() if v}
    # the FFN activation keeps B * T * d_ff floats
    assert direct["blocks.0.feedforward.act"] == ffn_activation_bytes(5, 12, 64, 4)


def test_dtype_halves_the_activation_bytes(tlab, tmp_path):
    out = tmp_path / "bf16"
    code, stdout, _ = tlab("experiment=budget", "model.d_model=32", "model.n_heads=4",
                           "model.d_ff=64", "routine.seq_len=16", "routine.dtype=bf16",
                           f"hydra.run.dir={out}")
    assert code == 0, stdout
    first = row(pd.read_csv(out / "budget.csv"), "ffn_hidden (first FFN activation)",
                "activations")
    assert first.expected == first.measured == 8 * 16 * 64 * 2


def test_formula_helpers():
    assert attention_params(768, False) == 2_359_296
    assert feedforward_params(768, 3072, False) == 4_718_592
    flops = training_flops_per_token(budget_model("model.n_layers=2", "routine.vocab_size=100"),
                                     512)
    n = 2 * (4 * 768**2 + 2 * 768 * 3072) + 768 * 100
    assert flops == {"weights": 6 * n, "attention": 12 * 2 * 512 * 768,
                     "total": 6 * n + 12 * 2 * 512 * 768}


@pytest.mark.parametrize("args, message", [
    (["--dtype", "fp8"], "--dtype fp8 is not known; valid: fp32, bf16, fp16"),
    (["--d-model", "100"], "not divisible by model.n_heads=12"),
    (["--d-model", "0"], "model.d_model=0 is not valid"),
    (["--vocab", "0"], "routine.vocab_size=0 is not valid"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    result = CliRunner().invoke(app, ["budget", *args, "--out", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "x").exists()


def test_unknown_dtype_through_hydra_exits_2(tlab, tmp_path):
    assert_refused(tlab("experiment=budget", "routine.dtype=fp8", "routine.measure=false",
                        f"hydra.run.dir={tmp_path / 'x'}"), tmp_path / "x", "fp8 is not known")
