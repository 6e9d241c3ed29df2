"""Cached decoding: a decoder with a KV cache gives the logits of the full forward, for every
built-in PE and architecture knob; ``generate`` decodes with it; step 1's ``cached_decoding``
passes the built-ins and catches the three cache mutants at the position where they go wrong.

Tolerance: the cached and full paths sum the same float32 products in a different order
(matrix products of other shapes, a softmax over the cached keys); each logit's error is a few
roundings (eps = 1.2e-7) times the square root of the sums' lengths, a few 1e-6 of the logits'
norm at 40 keys, so 1e-5 of that norm (the property's own tolerance) bounds it on any CPU/BLAS.
The models are the amplified copies of step 1 (weights at std 0.3): at ``init_std=0.02``
attention is nearly uniform and a wrong position would move the logits by float noise only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from transformer_lab.config.compose import compose
from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.measures.model_properties import (
    ADVICE,
    RELATIVE_TOLERANCE,
    amplified_copy,
    cached_decoding,
    decoding_spans,
    first_layer_only,
    position_max_len,
)
from transformer_lab.measures.property_result import relative_change
from transformer_lab.model import build_model, next_token
from transformer_lab.mutants import BY_NAME, mutant_config

VOCAB = 11
LENGTH = 40  # past every original_max_len below: the scalings switch on mid-sequence
SCALED = ["pe.factor=4", "pe.original_max_len=16"]

DECODERS = {
    "none": ["pe=none"],
    "sinusoidal": ["pe=sinusoidal"],
    "learned": ["pe=learned"],
    "sinusoidal_learned": ["pe=sinusoidal_learned"],
    "rope": ["pe=rope"],
    "rope_interleaved": ["pe=rope", "pe.style=interleaved"],
    "rope_partial": ["pe=rope", "pe.rotary_fraction=0.5", "model.d_model=16"],
    **{f"rope_{s}": ["pe=rope", f"pe.scaling={s}", *SCALED]
       for s in ("linear", "ntk", "dynamic", "yarn", "llama3")},
    "alibi": ["pe=alibi"],
    "t5": ["pe=t5"],
    # architecture knobs, two layers: the cache is per layer
    "rope_gqa_head_dim": ["pe=rope", "model.d_model=16", "model.n_heads=4", "model.n_kv_heads=2",
                          "model.head_dim=6", "model.n_layers=2"],
    "alibi_mqa": ["pe=alibi", "model.d_model=16", "model.n_heads=4", "model.n_kv_heads=1",
                  "model.n_layers=2"],
    "rope_parallel_block": ["pe=rope", "block=pre", "model.parallel_block=true",
                            "model.n_layers=2"],
    "t5_post_rmsnorm": ["pe=t5", "block=post", "norm_layer=rmsnorm", "model.n_layers=2"],
    "sinusoidal_sandwich_batchnorm": ["pe=sinusoidal", "block=sandwich",
                                      "norm_layer=batchnorm", "model.n_layers=2"],
    "rope_dynamic_deepnorm": ["pe=rope", "pe.scaling=dynamic", *SCALED, "block=deepnorm",
                              "model.n_layers=1"],  # several layers: see the test below
    "learned_moe": ["pe=learned", "ffn=moe", "model.n_layers=2"],
}


def _spec(cfg) -> ModelSpec:
    """The model of the composed ``cfg`` with a vocabulary of ``VOCAB``."""
    return RunSpec.of(cfg).with_vocab(VOCAB).model


def _model(*overrides: str, arch: str = "decoder"):
    model = build_model(_spec(compose(["experiment=smoke", f"arch={arch}", *overrides])), seed=0)
    return amplified_copy(model).eval()


def _tokens(batch: int = 2, length: int = LENGTH, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, length), generator=generator)  # (B, T)


@torch.no_grad()
def _worst_gap(model, tokens: torch.Tensor, step: int) -> float:
    """Decode ``tokens`` ``step`` at a time with a cache; the largest relative difference of a
    step's logits from the full forward over the same prefix (at the step's positions)."""
    cache, worst = model.new_cache(), 0.0
    for start in range(0, tokens.shape[1], step):
        end = min(start + step, tokens.shape[1])
        cached = model(tokens[:, start:end], cache=cache)  # (B, T_step, V)
        full = model(tokens[:, :end])[:, start:end]  # (B, T_step, V)
        worst = max(worst, float(relative_change(cached - full, full).max()))
    assert cache.length == tokens.shape[1]
    return worst


@pytest.mark.parametrize("name", list(DECODERS))
def test_cached_decoding_equals_the_full_forward(name):
    model = _model(*DECODERS[name])
    tokens = _tokens(length=min(LENGTH, position_max_len(model)))
    for step in (1, 3, 7):
        assert _worst_gap(model, tokens, step) <= RELATIVE_TOLERANCE, (name, step)


def test_a_length_dependent_pe_equals_the_full_forward_in_the_first_layer_only():
    """Dynamic NTK changes a prefix's hidden states when the sequence grows: the keys a deeper
    layer cached come from a shorter sequence, so only the first layer can match (every KV
    cache has this); ``cached_decoding`` compares that layer and says so."""
    model = _model("pe=rope", "pe.scaling=dynamic", *SCALED, "block=deepnorm",
                   "model.n_layers=2")
    tokens = _tokens()
    assert _worst_gap(model, tokens, 1) > 10 * RELATIVE_TOLERANCE
    assert _worst_gap(first_layer_only(model), tokens, 1) <= RELATIVE_TOLERANCE
    result = cached_decoding(model, VOCAB, 64)
    assert result.passed is True and "first layer only" in result.detail
    stale = _spec(mutant_config(BY_NAME["stale_dynamic_rope"], ["model.n_layers=2"]))
    result = cached_decoding(amplified_copy(build_model(stale, seed=0)), VOCAB, 64)
    assert result.passed is False and "first layer only" in result.detail
    plain = cached_decoding(_model("pe=rope", "model.n_layers=2"), VOCAB, 64)
    assert plain.passed is True and "first layer" not in plain.detail


def test_the_cache_holds_keys_before_rotation_per_layer():
    model = _model(*DECODERS["rope_gqa_head_dim"])
    tokens = _tokens(batch=3, length=5)
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens[:, :2], cache=cache)
        model(tokens[:, 2:], cache=cache)
    assert len(cache.layers) == 2 and cache.length == 5
    attention = model.blocks[0].attention
    for layer in cache.layers:
        assert layer.keys.shape == layer.values.shape == (3, 2, 5, 6)  # (B, H_kv, T, Dh)
    # layer 0's keys are the projections of the embeddings, unrotated
    with torch.no_grad():
        x = model.blocks[0].norm1(model.embed(tokens, torch.arange(5)))
        _, keys, values = attention.split_heads(x)
    torch.testing.assert_close(cache.layers[0].keys, keys, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cache.layers[0].values, values, atol=1e-6, rtol=1e-5)


def test_no_is_causal_when_the_query_and_key_lengths_differ(monkeypatch):
    """PyTorch aligns ``is_causal`` top-left when T_q < T_k (#108108): the model must pass an
    explicit mask then."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], is_causal, attn_mask))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    model = _model("pe=rope")
    cache = model.new_cache()
    with torch.no_grad():
        for start, end in ((0, 4), (4, 7), (7, 8)):
            model(_tokens(length=8)[:, start:end], cache=cache)
    assert [(q, k, causal) for q, k, causal, _ in calls] == [
        (4, 4, True), (3, 7, False), (1, 8, False)]
    chunk_mask = calls[1][3]  # (T_q, T_k), aligned bottom-right
    assert torch.equal(torch.isinf(chunk_mask), torch.ones(3, 7, dtype=torch.bool).triu(5))


@pytest.mark.parametrize("pe", ["rope", "alibi", "t5"])
def test_every_query_sees_itself_and_no_later_key(pe):
    """No fully masked row: with T_q new tokens after T_k - T_q cached ones, the query at
    position p attends to keys 0..p, itself included, and never to a later key."""
    model = _model(f"pe={pe}")
    tokens = _tokens(batch=1, length=9)
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens[:, :5], cache=cache)
        model(tokens[:, 5:], cache=cache, need_weights=True)
    weights = model.blocks[0].attention.last_weights[0]  # (H, 4, 9)
    assert weights.shape[-2:] == (4, 9) and torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:2]))
    query_positions = torch.arange(5, 9)[:, None]  # (4, 1)
    keys = torch.arange(9)[None, :]  # (1, 9)
    assert torch.all(weights[:, keys.expand(4, 9) > query_positions] == 0)
    assert torch.all(weights[:, torch.arange(4), torch.arange(5, 9)] > 0)  # itself


def test_an_encoder_has_no_cache():
    model = _model("pe=rope", arch="encoder")
    with pytest.raises(ConfigError, match=r"needs a decoder \(arch=decoder\).*encoder"):
        model.new_cache()
    with pytest.raises(ConfigError, match="arch=decoder"):
        model.generate(_tokens(length=3), 2)
    result = cached_decoding(model, VOCAB, 16)
    assert result.passed is None and "encoder" in result.detail


# --------------------------------------------------------------------------------------------
# generate


@torch.no_grad()
def _greedy_without_cache(model, prefix: torch.Tensor, n_new: int) -> tuple[torch.Tensor, list]:
    """The old ``generate``: the whole sequence forward again for every new token. Returns the
    tokens (B, n_new) and each step's logits (B, V)."""
    tokens, logits = prefix, []
    for _ in range(n_new):
        last = model(tokens)[:, -1]  # (B, V)
        logits.append(last)
        tokens = torch.cat([tokens, last.argmax(-1, keepdim=True)], dim=1)
    return tokens[:, prefix.shape[1]:], logits


@pytest.mark.parametrize("name", ["sinusoidal", "rope_dynamic", "alibi", "t5",
                                  "rope_gqa_head_dim"])
def test_greedy_generate_with_the_cache_gives_the_uncached_tokens(name):
    """Same tokens up to an argmax tie at float32 rounding: where a row first differs, the two
    tokens' logits were within the tolerance of each other; after that the rows diverge."""
    model = _model(*DECODERS[name])
    prefix = _tokens(batch=16, length=4, seed=1)
    cached = model.generate(prefix, 30)
    reference, logits = _greedy_without_cache(model, prefix, 30)
    assert cached.shape == (16, 30) and cached.dtype == prefix.dtype
    for row in range(16):
        differs = torch.nonzero(cached[row] != reference[row])
        if len(differs):
            step = int(differs[0])
            step_logits = logits[step][row]  # (V,)
            gap = step_logits[reference[row, step]] - step_logits[cached[row, step]]
            assert gap <= RELATIVE_TOLERANCE * step_logits.norm(), (row, step, float(gap))
    assert (cached == reference).all(dim=1).float().mean() >= 0.9  # ties are rare


def test_the_reverse_task_decodes_with_generate_as_before():
    """``exact_match`` of a decoder decodes greedily with ``model.generate`` (now cached): the
    same tokens as the uncached loop over the task's held-out prefixes."""
    from transformer_lab.tasks.sequence import ReverseTask

    task = ReverseTask(seq_len=4, vocab_size=VOCAB, causal=True, eval_size=64)
    model = _model("pe=rope")
    batch = task.eval_batch()
    prefix = batch.inputs[:, : task.seq_len + 1]
    reference, _ = _greedy_without_cache(model, prefix, task.seq_len)
    assert torch.equal(model.generate(prefix, task.seq_len), reference)
    expected = (reference == batch.targets[:, task.seq_len:]).all(dim=1).float().mean().item()
    assert task.exact_match(model, batch) == expected


def test_sampling_is_reproducible_under_a_seeded_generator():
    model = _model("pe=rope")
    prefix = _tokens(batch=4, length=3)

    def sample(seed: int, **kwargs) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed)
        return model.generate(prefix, 20, temperature=1.0, generator=generator, **kwargs)

    assert torch.equal(sample(0), sample(0))
    assert not torch.equal(sample(0), sample(1))
    assert torch.equal(sample(0, top_k=1), model.generate(prefix, 20))  # top-1 is greedy
    assert model.generate(prefix, 0).shape == (4, 0)


def test_next_token_draws_from_the_tempered_top_k():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]]).repeat(20000, 1)  # (N, V)
    generator = torch.Generator().manual_seed(0)
    drawn = next_token(logits, temperature=2.0, top_k=3, generator=generator)[:, 0]  # (N,)
    assert set(drawn.tolist()) <= {0, 1, 4}  # the 3 largest
    expected = torch.softmax(torch.tensor([2.0, 1.0, 3.0]) / 2.0, dim=0)  # tokens 0, 1, 4
    frequency = torch.stack([(drawn == t).float().mean() for t in (0, 1, 4)])
    sigma = (expected * (1 - expected) / len(drawn)).sqrt()
    assert torch.all((frequency - expected).abs() <= 5 * sigma), (frequency, expected)
    assert torch.equal(next_token(logits[:2]), torch.tensor([[4], [4]]))  # temperature 0


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.5}, "temperature=-0.5 is not valid"),
    ({"temperature": 1.0, "top_k": 0}, "top_k=0 is not valid"),
    ({"n_new": -1}, "n_new=-1 is not valid"),
])
def test_generate_refuses_bad_settings_naming_them(kwargs, message):
    model = _model("pe=rope")
    n_new = kwargs.pop("n_new", 3)
    with pytest.raises(ConfigError, match=message):
        model.generate(_tokens(length=2), n_new, **kwargs)


# --------------------------------------------------------------------------------------------
# step 1's cached_decoding and the cache mutants


def test_decoding_spans_cover_the_sequence_once_and_straddle_the_powers_of_two():
    for max_len, step in ((256, 1), (256, 3), (64, 3), (17, 3), (5, 3), (1, 1)):
        spans = decoding_spans(max_len, step)
        assert [s for s, _, _ in spans] == [0] + [e for _, e, _ in spans[:-1]]  # no gap
        assert spans[-1][1] == max_len and spans[-1][2]  # the last tokens are compared
        compared = [(s, e) for s, e, c in spans if c]
        assert all(e - s <= step for s, e in compared)
        checked = {p for s, e in compared for p in range(s, e)}
        assert set(range(min(8, max_len))) <= checked
        for power in (16, 32, 64, 128):
            if power < max_len:  # the last position of a length p and the first after it
                assert {power - 1, power} <= checked, (max_len, step, power)


@pytest.mark.parametrize("name", ["offset_blind_rope", "stale_dynamic_rope", "top_left_alibi"])
def test_each_cache_mutant_equals_its_built_in_in_a_full_forward_and_fails_cached_decoding(name):
    mutant = amplified_copy(build_model(_spec(mutant_config(BY_NAME[name])), seed=0)).eval()
    built_in = _model("pe=alibi" if "alibi" in name else "pe=rope",
                      *(["pe.scaling=dynamic", "pe.factor=2", "pe.original_max_len=16"]
                        if name == "stale_dynamic_rope" else []))
    built_in.load_state_dict(mutant.state_dict())
    tokens = _tokens(length=LENGTH)
    with torch.no_grad():
        torch.testing.assert_close(mutant(tokens), built_in(tokens), atol=1e-6, rtol=1e-5)
    result = cached_decoding(mutant, VOCAB, 64)
    assert result.passed is False and result.value > RELATIVE_TOLERANCE
    assert ADVICE in result.detail
    first = {"offset_blind_rope": "position 1 (one token at a time)",
             "stale_dynamic_rope": "position 15 (3 tokens at a time)",  # 18 > 16 tokens
             "top_left_alibi": "position 1 (one token at a time)"}[name]
    assert result.detail.startswith(first), result.detail
    assert cached_decoding(built_in, VOCAB, 64).passed is True


def test_the_cache_mutants_are_classified_by_tlab_mutants():
    from types import SimpleNamespace

    from transformer_lab.routines.mutants import examine, suite

    cfg = compose(["experiment=mutants"])
    cfg.routine.only = ["offset_blind_rope", "stale_dynamic_rope", "top_left_alibi",
                        "pe=rope/decoder", "pe=alibi/decoder"]
    run = SimpleNamespace(metrics=None, path=None)
    verdicts = {c.name: examine(c, run, reversal=False) for c in suite(cfg)}
    assert {name: (v.outcome, v.caught) for name, v in verdicts.items()} == {
        "offset_blind_rope": ("caught-expected", "step1:cached_decoding"),
        "stale_dynamic_rope": ("caught-expected", "step1:cached_decoding"),
        "top_left_alibi": ("caught-expected", "step1:cached_decoding"),
        "pe=rope/decoder": ("correct-passed", ""),
        "pe=alibi/decoder": ("correct-passed", ""),
    }


def test_a_cache_past_the_learned_table_is_refused_naming_the_length():
    """The model checks ``offset + T`` against its PE's ``context_window`` (the learned table
    checks only the ``T`` it is given)."""
    model = _model("pe=learned", "model.max_len=8")
    cache = model.new_cache()
    with torch.no_grad():
        model(_tokens(length=6), cache=cache)
        with pytest.raises(ValueError, match=r"sequence length 9 is longer than .*\b8\b"):
            model(_tokens(length=3), cache=cache)
