"""The assembled model: shapes, parameter formulas, and what positional information does."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch

from transformer_lab.config.tree import group_choices
from transformer_lab.measures.parameters import parameter_breakdown
from transformer_lab.model import build_model

PES = group_choices("pe")
NORMS = group_choices("block")
NORM_LAYERS = group_choices("norm_layer")
ACTIVATIONS = group_choices("ffn")


@pytest.mark.parametrize("norm, norm_layer", list(itertools.product(NORMS, NORM_LAYERS)))
@pytest.mark.parametrize("pe", PES)
def test_parameter_count_equals_formula(spec_for, pe, norm, norm_layer):
    spec, _ = spec_for(f"pe={pe}", f"block={norm}", f"norm_layer={norm_layer}", "model=small",
                       "ffn=swiglu", "model.gated_match_params=true", "model.ffn_bias=false")
    model = build_model(spec.model)
    assert parameter_breakdown(spec.model)["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_parameter_count_per_activation(spec_for, activation):
    spec, _ = spec_for(f"ffn={activation}", "model.attn_bias=false")
    model = build_model(spec.model)
    parts = parameter_breakdown(spec.model)
    assert parts["total"] == sum(p.numel() for p in model.parameters())
    ffn = model.blocks[0].feedforward
    assert parts["feedforward"] == sum(p.numel() for p in ffn.parameters())


def _encoder(spec_for, pe: str):
    spec, _ = spec_for(f"pe={pe}", "model.d_model=16", "model.n_heads=2", "model.n_layers=2",
                       "arch=encoder", "block=pre", "model.init_std=0.3")  # visible attention
    torch.manual_seed(0)
    model = build_model(spec.model).eval()
    if pe == "t5":  # learned biases start near zero: make them visible for the test
        torch.nn.init.normal_(model.positional.relative_attention_bias.weight, std=1.0)
    return model


def test_nope_encoder_is_permutation_equivariant(spec_for):
    model = _encoder(spec_for, "none")
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens[:, perm]), model(tokens)[:, perm])


@pytest.mark.parametrize("pe", [p for p in PES if p != "none"])
def test_every_positional_encoding_breaks_permutation_equivariance(spec_for, pe):
    model = _encoder(spec_for, pe)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6]])
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    with torch.no_grad():
        difference = (model(tokens[:, perm]) - model(tokens)[:, perm]).abs().max()
    assert difference > 1e-4, f"{pe}: output just permutes, position is ignored"


def test_seed_example_nope_cannot_tell_who_hit_whom(spec_for):
    """'我打你' vs '你打我': without a PE the per-token outputs are the same, only permuted."""
    model = _encoder(spec_for, "none")
    wo, da, ni = 1, 2, 3
    with torch.no_grad():
        a = model(torch.tensor([[wo, da, ni]]))
        b = model(torch.tensor([[ni, da, wo]]))
    torch.testing.assert_close(a[0, 0], b[0, 2])  # '我' gets the same vector in both sentences
    rope = _encoder(spec_for, "rope")
    with torch.no_grad():
        a, b = rope(torch.tensor([[wo, da, ni]])), rope(torch.tensor([[ni, da, wo]]))
    assert (a[0, 0] - b[0, 2]).abs().max() > 1e-4


@pytest.mark.parametrize("pe", PES)
def test_decoder_is_causal_for_every_pe(spec_for, pe):
    spec, _ = spec_for(f"pe={pe}", "arch=decoder", "model.d_model=16", "model.n_layers=2")
    torch.manual_seed(0)
    model = build_model(spec.model).eval()
    a = torch.tensor([[1, 2, 3, 4, 5, 6]])
    b = a.clone()
    b[0, 4:] = torch.tensor([7, 8])
    with torch.no_grad():
        torch.testing.assert_close(model(a)[:, :4], model(b)[:, :4])


def test_attention_maps_shapes(spec_for):
    spec, _ = spec_for("pe=alibi", "model.n_layers=2")
    model = build_model(spec.model)
    maps = model.attention_maps(torch.tensor([[1, 2, 3, 4]]))
    assert [m.shape for m in maps] == [(1, 2, 4, 4)] * 2


def test_embedding_scale_and_pe_scale(spec_for):
    spec, _ = spec_for("pe=sinusoidal", "model.embed_scale=none", "model.pe_scale=0.5")
    model = build_model(spec.model)
    tokens = torch.tensor([[1, 2, 3, 4]])
    expected = model.token_embedding(tokens) + 0.5 * model.positional(torch.arange(4))
    torch.testing.assert_close(model.embed(tokens, torch.arange(4)), expected)
    assert build_model(replace(spec.model, embed_scale="sqrt")).embed_scale == pytest.approx(8**0.5)


def test_context_window_is_the_one_the_pe_declares(spec_for):
    def decoder(*overrides: str):
        spec, _ = spec_for("arch=decoder", "model.max_len=12", "model.init_std=0.3",
                           "model.d_model=16", "model.n_layers=2", "model.embed_scale=none",
                           *overrides)
        return build_model(spec.model, seed=0).eval()

    assert decoder("pe=learned").context_window == 12
    assert decoder("pe=learned", "pe.interpolate=true").context_window is None
    model = decoder("pe=rope")
    assert model.context_window is None
    model.positional.context_window = 3  # a PE of the user's own that declares a window
    prefix = torch.tensor([[1, 2, 3, 4, 5, 6]])
    ids = prefix[0].tolist()
    with torch.no_grad():  # the reference: a full forward over the last 3 tokens each time
        for _ in range(8):
            ids.append(int(model(torch.tensor([ids[-3:]]))[0, -1].argmax()))
    assert model.generate(prefix, 8)[0].tolist() == ids[6:]


@pytest.mark.parametrize("pe", ["learned", "rope", "sinusoidal"])
def test_the_pe_reads_no_position_values_so_the_forward_is_one_graph(spec_for, pe):
    """No ``int(positions.max())`` (a device sync) in the forward: torch.compile's fullgraph
    raises at a graph break."""
    spec, _ = spec_for(f"pe={pe}", "arch=decoder")
    model = build_model(spec.model, seed=0).eval()
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    torch.compiler.reset()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(tokens), model(tokens), rtol=0, atol=0)
