"""Hugging Face interop (issue 14): random-init ``transformers`` models saved with
``save_pretrained`` into a temp dir, imported with ``from_hf``: equal logits (fp32, <= 1e-5)
at several lengths, including beyond ``original_max_position_embeddings`` for each RoPE
scaling; tlab -> HF -> tlab exact; tlab's MoE against Mixtral's sparse MoE block. Skipped with
a reason when the ``hf`` extra is not installed."""

from __future__ import annotations

import contextlib

import pytest
import torch
from helpers import read_csv

from transformer_lab.components.moe import MoEFeedForward
from transformer_lab.errors import ConfigError

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'transformer_lab[hf]')")
from transformer_lab.interop.hf import from_hf, preset_of, to_hf  # noqa: E402

SMALL = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=64)
ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0,
                "original_max_position_embeddings": 16},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
             "original_max_position_embeddings": 16, "beta_fast": 16.0, "beta_slow": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
}
LENGTHS = (5, 16, 40, 80)  # > original_max_position_embeddings (16) and max (64)


def _hf(kind: str, rope: str = "default", **extra):
    torch.manual_seed(0)
    if kind == "mixtral":
        config = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2,
                                            rope_parameters=ROPE[rope], **extra)
        return transformers.MixtralForCausalLM(config).eval()
    config = transformers.LlamaConfig(**SMALL, rope_parameters=ROPE[rope], **extra)
    return transformers.LlamaForCausalLM(config).eval()


def _max_diff(hf, model, length: int) -> float:
    tokens = torch.randint(0, 50, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        expected = hf(tokens).logits
        assert expected.abs().max() > 1e-3  # a real comparison, not of zeros
        return (expected - model(tokens)).abs().max().item()


@pytest.mark.parametrize("kind, rope", [("llama", r) for r in ROPE] + [("mixtral", "default"),
                                                                        ("mixtral", "yarn")])
def test_saved_checkpoint_imports_with_equal_logits(tmp_path, kind, rope):
    hf = _hf(kind, rope)
    hf.save_pretrained(tmp_path)
    spec, model = from_hf(str(tmp_path))
    assert spec.pe["scaling"] == {"default": "none"}.get(rope, rope)
    for length in LENGTHS:
        assert _max_diff(hf, model, length) <= 1e-5, (kind, rope, length)


@pytest.mark.parametrize("kind", ["llama", "mixtral"])
def test_round_trip_is_exact(kind):
    hf = _hf(kind, "yarn")
    spec, model = from_hf(hf)
    back = to_hf(model, spec)
    assert hf.state_dict().keys() == back.state_dict().keys()
    for name, tensor in hf.state_dict().items():
        assert torch.equal(tensor, back.state_dict()[name]), name
    _, again = from_hf(back)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_qwen2_style_biases_are_expressed():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**SMALL)
    hf = transformers.Qwen2ForCausalLM(config).eval()
    spec, model = from_hf(hf)
    assert spec.qkv_bias is True and spec.out_bias is False
    assert _max_diff(hf, model, 12) <= 1e-5


def test_unsupported_setting_is_named(tmp_path):
    hf = _hf("llama", hidden_act="gelu")
    with pytest.raises(ConfigError, match="hidden_act='gelu'"):
        from_hf(hf)
    with pytest.raises(ConfigError, match="not a local Hugging Face model directory"):
        from_hf(str(tmp_path))


def test_moe_matches_mixtral_sparse_block():
    """Router logits, the experts chosen, the output and the load-balance loss of tlab's MoE
    equal HF Mixtral's."""
    from transformers.models.mixtral import modeling_mixtral as mm

    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SMALL, num_local_experts=4, num_experts_per_tok=2)
    block = mm.MixtralSparseMoeBlock(config).eval()
    ours = MoEFeedForward(32, 48, n_experts=4, top_k=2, expert="swiglu", bias=False)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
        ours.gate.weight.copy_(block.gate.weight)
        for e, expert in enumerate(ours.experts):
            gate, up = block.experts.gate_up_proj[e].chunk(2, dim=0)
            expert.gate_proj.weight.copy_(gate)
            expert.up_proj.weight.copy_(up)
            expert.down_proj.weight.copy_(block.experts.down_proj[e])
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        expected = block(x)
        expected = expected[0] if isinstance(expected, tuple) else expected
        got = ours(x)
        logits = ours.gate(x.reshape(-1, 32))
        _, hf_logits_scores, hf_chosen = block.gate(x)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(logits, block.gate(x)[0], atol=0, rtol=0)
    assert torch.equal(ours.route(logits)[1], hf_chosen)
    torch.testing.assert_close(ours.aux_loss, ours.load_balance_coef
                               * mm.load_balancing_loss_func((logits,), 4, top_k=2))


# --------------------------------------------------------------------------------------------
# GPT-2, GPT-NeoX, BERT, T5 encoder

OTHER = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_embd=32, n_head=4, n_layer=2, n_positions=64, bos_token_id=None,
        eos_token_id=None)),
    "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=64, max_position_embeddings=64, bos_token_id=None, eos_token_id=None)),
    "gpt_neox_sequential": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=64, use_parallel_residual=False, attention_bias=False,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0,
                         "partial_rotary_factor": 0.5}, bos_token_id=None, eos_token_id=None)),
    "bert": lambda: transformers.BertModel(transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
        intermediate_size=64, max_position_embeddings=64)),
    "t5_encoder": lambda: transformers.T5EncoderModel(transformers.T5Config(
        vocab_size=50, d_model=32, d_kv=16, d_ff=64, num_heads=4, num_layers=2,
        relative_attention_num_buckets=16, relative_attention_max_distance=32)),
}
OTHER_LENGTHS = (5, 16, 40, 64)  # 64 = the learned tables' size (GPT-2, BERT)


def _other(kind: str):
    """A random-init model whose norms and biases are not at their initial 1 and 0."""
    torch.manual_seed(0)
    hf = OTHER[kind]().eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return hf


def _output_diff(hf, model, length: int) -> float:
    tokens = torch.randint(0, 50, (2, length), generator=torch.Generator().manual_seed(length))
    with torch.no_grad():
        out = hf(tokens)
        expected = out.logits if hasattr(out, "logits") else out.last_hidden_state
        assert expected.abs().max() > 1e-1
        return (expected - model(tokens)).abs().max().item()


@pytest.mark.parametrize("kind", list(OTHER))
def test_other_families_import_with_equal_outputs(tmp_path, kind):
    """Logits (GPT-2, NeoX) or final hidden states (BERT, T5 encoder) equal to <= 1e-5."""
    hf = _other(kind)
    hf.save_pretrained(tmp_path)
    spec, model = from_hf(str(tmp_path))
    assert preset_of(spec) == kind.removesuffix("_sequential")
    if kind == "gpt_neox_sequential":
        assert not spec.parallel_block and spec.pe["rotary_fraction"] == 0.5
        assert spec.pe["scaling"] == "linear"
    for length in OTHER_LENGTHS:
        assert _output_diff(hf, model, length) <= 1e-5, (kind, length)


@pytest.mark.parametrize("kind", list(OTHER))
def test_other_families_round_trip_exactly(kind):
    """tlab -> HF -> tlab is exact for every family; HF -> tlab -> HF too, except BERT's
    token-type table (folded into the position table on import, exported as zeros)."""
    hf = _other(kind)
    spec, model = from_hf(hf)
    back = to_hf(model, spec)
    _, again = from_hf(back)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    if kind != "bert":
        for name, tensor in hf.state_dict().items():
            assert torch.equal(tensor, back.state_dict()[name]), name
    assert _output_diff(back, model, 12) <= 1e-5


def test_gated_t5_is_refused_by_name():
    config = transformers.T5Config(vocab_size=50, d_model=32, d_kv=8, d_ff=64, num_heads=4,
                                   num_layers=1, feed_forward_proj="gated-gelu")
    with pytest.raises(ConfigError, match="feed_forward_proj='gated-gelu'"):
        from_hf(transformers.T5EncoderModel(config))


# --------------------------------------------------------------------------------------------
# --from-hf on check, plot-pe and extrapolate


def _tlab(*args: str):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    result = CliRunner().invoke(app, list(args))
    text = result.output
    with contextlib.suppress(ValueError):  # older Click: stderr already in output
        text += result.stderr
    return result.exit_code, " ".join(text.split())


@pytest.fixture(scope="module")
def saved_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama")
    _hf("llama").save_pretrained(path)  # vocab 50, 4 heads (2 K/V heads) of 8
    return path


def test_check_from_hf_checks_the_checkpoint(tmp_path, saved_llama):
    code, text = _tlab("check", "--from-hf", str(saved_llama), "--out", str(tmp_path / "c"))
    assert code == 0, text
    rows = read_csv(tmp_path / "c" / "checks.csv")
    assert {r["component"].split()[0] for r in rows} == {"pe=rope"}
    assert {"rope_relative", "pe_breaks_permutation", "swap_attention"} <= {
        r["check"] for r in rows}
    saved = (tmp_path / "c" / "config.yaml").read_text()
    assert "from_hf" in saved and "n_kv_heads: 2" in saved


def test_extrapolate_from_hf_evaluates_without_training(tmp_path, saved_llama):
    text_file = tmp_path / "text.txt"
    text_file.write_text("abcdefghij klmnop " * 40)
    code, text = _tlab("extrapolate", "--from-hf", str(saved_llama), "--task", "text",
                       f"task.path={text_file}", "task.seq_len=16", "--scaling",
                       "none,linear,yarn", "--out", str(tmp_path / "e"))
    assert code == 0, text
    rows = read_csv(tmp_path / "e" / "extrapolation.csv")
    assert {r["scaling"] for r in rows} == {"none", "linear", "yarn"}
    assert {int(r["eval_len"]) for r in rows} == {16, 32, 64}
    assert {r["train_steps"] for r in rows} == {"0"} and {r["status"] for r in rows} == {"ok"}
    at_64 = {r["scaling"]: float(r["loss"]) for r in rows if r["eval_len"] == "64"}
    assert at_64["none"] != at_64["linear"]  # the scalings changed the checkpoint's RoPE


def test_plot_pe_from_hf_draws_the_checkpoint_table(tmp_path):
    hf = _other("gpt2")
    hf.save_pretrained(tmp_path / "gpt2")
    code, text = _tlab("plot-pe", "--from-hf", str(tmp_path / "gpt2"), "--max-len", "20",
                       "--out", str(tmp_path / "p"))
    assert code == 0, text
    rows = read_csv(tmp_path / "p" / "pe_values.csv")
    table = hf.transformer.wpe.weight.detach()
    assert float(rows[3]["dim 1"]) == pytest.approx(table[3, 1].item(), abs=1e-6)


@pytest.mark.parametrize("case, args, message", [
    ("missing", [], "is not a local Hugging Face model directory"),
    ("unsupported", [], "hidden_act='gelu'"),
    ("vocab", ["--task", "text", "task.tokenizer=byte"], "vocabulary (256 tokens) is larger"),
    ("pe", ["--pe", "alibi"], "--from-hf evaluates the checkpoint's own PE"),
])
def test_from_hf_bad_input_exits_2_writing_nothing(tmp_path, saved_llama, case, args, message):
    source = {"missing": tmp_path / "nowhere", "unsupported": tmp_path / "gelu"}.get(
        case, saved_llama)
    if case == "unsupported":
        _hf("llama", hidden_act="gelu").save_pretrained(source)
    text_file = tmp_path / "text.txt"
    text_file.write_text("some text " * 400)
    extra = [f"task.path={text_file}", "task.seq_len=16"] if case == "vocab" else []
    code, text = _tlab("extrapolate", "--from-hf", str(source), *args, *extra,
                       "--out", str(tmp_path / "x"))
    assert code == 2 and message in text, text
    assert "Traceback" not in text
    assert not (tmp_path / "x").exists()
