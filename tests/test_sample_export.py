"""A trained run's models afterwards (issue 25): ``tlab sample`` (greedy deterministic, seeded
draws reproducible, prompts the tokenizer cannot encode refused), ``tlab export --to-hf`` (a
``transformers`` causal LM and tokenizer: same token ids, same logits, the same greedy
continuation as ``tlab sample --greedy``; what HF cannot express refused naming the knob) and
``--from-run`` on check, plot-pe and extrapolate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.app.hydra_app import main
from transformer_lab.cli import app
from transformer_lab.data.tokenizer import ByteTokenizer, CharTokenizer, train_bpe
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.results.run_directory import WEIGHTS_FILE
from transformer_lab.training.checkpoint import load_trained, save_weights

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'transformer_lab[hf]')")

VERSE = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
         "The slings and arrows of outrageous fortune,\nOr to take arms against a sea of "
         "troubles\nAnd by opposing end them. To die: to sleep;\nNo more; and by a sleep to say "
         "we end\nThe heart-ache and the thousand natural shocks\nThat flesh is heir to.\n\n")
TEXT = VERSE * 8  # a few KB of text: the tiny model learns its lines in a few dozen steps
TINY_TEXT = ["experiment=train", "task=text", "task.seq_len=32", "task.eval_size=32",
             "train.batch_size=8", "train.lr=1e-2", "train.eval_every=0", "train.warmup=5",
             "logger.progress=false"]


def tlab(*args: str | Path) -> tuple[int, str, str]:
    """A ``tlab`` command through its command line: (exit code, stdout, stderr)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def trained_run(root: Path, name: str, *overrides: str) -> Path:
    text = root / "verse.txt"
    text.write_text(TEXT, encoding="utf-8")
    out = root / name
    assert main([*TINY_TEXT, f"task.path={text}", *overrides, f"hydra.run.dir={out}"]) == 0
    return out


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    """A tiny LLaMA (preset=llama, 1 layer, 32 wide) trained 200 steps on the verse, characters
    (a second on a laptop core)."""
    return trained_run(tmp_path_factory.mktemp("runs"), "llama", "preset=llama",
                       "model.n_layers=1", "model.d_model=32", "model.d_ff=86", "train.steps=200")


# --- tlab sample ----------------------------------------------------------------------------

def test_greedy_sampling_is_the_argmax_of_the_full_forward(llama_run):
    code, out, err = tlab("sample", llama_run, "--prompt", "To be", "--tokens", "24",
                          "--greedy")
    assert code == 0, err
    assert f"{llama_run / WEIGHTS_FILE} (seed 0)" in err and "greedy" in err
    assert tlab("sample", llama_run, "--prompt", "To be", "--tokens", "24", "--greedy")[1] == out
    # an independent reference: no KV cache, the whole sequence forward for every token
    trained = load_trained(llama_run / WEIGHTS_FILE)
    ids = list(trained.tokenizer.encode("To be"))
    with torch.no_grad():
        for _ in range(24):
            ids.append(int(trained.model(torch.tensor([ids]))[0, -1].argmax()))
    assert out == trained.tokenizer.decode(ids) + "\n"  # the prompt echoed, then the new text
    assert tlab("sample", llama_run, "--prompt", "To be", "--tokens", "24", "--greedy",
                "--no-echo")[1] == trained.tokenizer.decode(ids[5:]) + "\n"


def test_seeded_sampling_is_reproducible(llama_run):
    draw = ("sample", llama_run, "--prompt", "T", "--tokens", "40", "--temperature", "1.5")
    first, again, other = (tlab(*draw, "--seed", s)[1] for s in ("3", "3", "4"))
    assert first == again and first != other
    greedy = tlab("sample", llama_run, "--prompt", "T", "--tokens", "40", "--greedy")[1]
    assert tlab(*draw, "--top-k", "1", "--seed", "5")[1] == greedy  # top-1 is the argmax


def test_a_fresh_seed_by_default_printed_to_reuse(llama_run):
    draw = ("sample", llama_run, "--prompt", "T", "--tokens", "40", "--no-echo")
    runs = [tlab(*draw) for _ in range(2)]
    seeds = [int(err.split("reuse with --seed ")[1].split(")")[0]) for _, _, err in runs]
    assert seeds[0] != seeds[1] and runs[0][1] != runs[1][1]
    again = tlab(*draw, "--seed", str(seeds[0]))
    assert again[1] == runs[0][1] and f"seed {seeds[0]}" in again[2]
    assert "reuse with" not in again[2]  # a seed given is not news


def test_num_samples_draw_several_continuations_from_one_seed(llama_run):
    draw = ("sample", llama_run, "--prompt", "To", "--tokens", "30", "--temperature", "1.5",
            "--num-samples", "3", "--seed", "7")
    code, out, err = tlab(*draw)
    assert code == 0 and "x 3 samples" in err, err
    samples = out.split("\n" + "-" * 15 + "\n")
    assert len(samples) == 3 and all(sample.startswith("To") for sample in samples)
    assert len({sample for sample in samples}) == 3  # three draws, not one repeated
    assert tlab(*draw)[1] == out


def test_top_p_keeps_the_nucleus(llama_run):
    from transformer_lab.model import next_token

    logits = torch.log(torch.tensor([[0.5, 0.05, 0.25, 0.15, 0.05]])).repeat(20000, 1)
    generator = torch.Generator().manual_seed(0)
    drawn = next_token(logits, temperature=1.0, top_p=0.8, generator=generator)[:, 0]
    # sorted: 0.5, 0.25, 0.15 (0.9 >= 0.8 reached at the third): tokens 0, 2, 3, renormalised
    assert set(drawn.tolist()) == {0, 2, 3}
    expected = torch.tensor([0.5, 0.25, 0.15]) / 0.9
    frequency = torch.stack([(drawn == t).float().mean() for t in (0, 2, 3)])
    sigma = (expected * (1 - expected) / len(drawn)).sqrt()
    assert torch.all((frequency - expected).abs() <= 5 * sigma), (frequency, expected)
    # a nucleus smaller than the top token's probability: the argmax, as --greedy
    greedy = tlab("sample", llama_run, "--prompt", "T", "--tokens", "20", "--greedy")[1]
    assert tlab("sample", llama_run, "--prompt", "T", "--tokens", "20", "--top-p", "1e-6")[1] \
        == greedy


def test_sampling_past_a_learned_table_crops_the_context(tmp_path):
    """A learned position table of 16 (preset=gpt2): 40 new tokens, each from the last 16
    tokens (nanoGPT's crop), where tlab stopped at the table's end before."""
    run = trained_run(tmp_path, "gpt2", "preset=gpt2", "model.n_layers=1", "model.d_model=16",
                      "model.max_len=16", "task.seq_len=16", "train.steps=5",
                      "model.embed_scale=sqrt")
    code, out, err = tlab("sample", run, "--prompt", "To be, or", "--tokens", "40", "--greedy")
    assert code == 0, err
    assert "context cropped to the model's last 16 tokens" in " ".join(err.split())
    trained = load_trained(run / WEIGHTS_FILE)
    ids = list(trained.tokenizer.encode("To be, or"))
    with torch.no_grad():  # the reference: a full forward over the last 16 tokens each time
        for _ in range(40):
            ids.append(int(trained.model(torch.tensor([ids[-16:]]))[0, -1].argmax()))
    assert out == trained.tokenizer.decode(ids) + "\n"
    # the exported model's own code crops as tlab sample does (a tied head with a scale: no
    # family holds it)
    code, stdout, err = tlab("export", run, "--to-hf", tmp_path / "hf")
    assert code == 0 and "TlabForCausalLM" in stdout, err
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                           trust_remote_code=True).eval()
    prompt = torch.tensor([ids[:9]])
    generated = hf.generate(prompt, max_new_tokens=40, do_sample=False)[0]
    assert generated.tolist() == ids


def test_a_failing_continuation_names_no_option_sample_lacks(llama_run, monkeypatch):
    from transformer_lab.routines import sample as sample_routine

    def past_the_table(*args, **kwargs):
        raise ValueError("sequence length 70 is longer than the learned position table "
                         "(max_len=64); use a larger max_len, or interpolate=True")

    trained = load_trained(llama_run / WEIGHTS_FILE)
    monkeypatch.setattr(trained.model, "generate", past_the_table)
    with pytest.raises(ConfigError) as refusal:
        sample_routine.continue_prompt(trained, torch.tensor([[1, 2]]),
                                       sample_routine.Sampling(tokens=5))
    message = str(refusal.value)
    assert "longer than the learned position table (max_len=64)" in message
    assert "interpolate" not in message and "give a shorter --prompt or fewer --tokens" in message


@pytest.mark.parametrize(("args", "expected"), [
    (["--prompt", "To bé"], "has characters the run's tokenizer does not know: 'é'"),
    (["--prompt", ""], "--prompt is empty"),
    (["--greedy", "--temperature", "0.7"], "--greedy takes the most likely token"),
    (["--greedy", "--top-p", "0.9"], "--greedy takes the most likely token; --top-p 0.9 draws"),
    (["--variant", "alibi"], "has no model of variant alibi; valid: seeds 0"),
    (["--model-seed", "3"], "has no model of seed 3; valid: seeds 0"),
])
def test_sample_refuses_bad_input_in_one_line(llama_run, args, expected):
    code, out, err = tlab("sample", llama_run, *args)
    flat = " ".join(err.split())
    assert code == 2 and expected in flat and out == "", err
    assert len(err.strip().splitlines()) <= 3 and "Traceback" not in err


def test_sample_of_a_synthetic_run_prints_tokens_and_refuses_an_encoder(tmp_path):
    runs = []
    for name, overrides in (("lm", ["task=lm"]), ("encoder", ["task=reverse", "arch=encoder"])):
        out = tmp_path / name
        assert main(["experiment=train", "model=tiny", *overrides, "train.steps=5",
                     "routine.seeds=2", "logger.progress=false", f"hydra.run.dir={out}"]) == 0
        runs.append(out)
    code, out, err = tlab("sample", runs[0], "--prompt", "3 1 4", "--tokens", "6",
                          "--model-seed", "1")
    assert code == 0 and "(seed 1; 1 other model in the run" in err
    assert out.split()[:3] == ["3", "1", "4"] and len(out.split()) == 9  # the prompt echoed
    assert all(0 <= int(t) < 64 for t in out.split())
    code, _, err = tlab("sample", runs[0], "--prompt", "3 70")
    assert code == 2 and "'70' is no token" in err and "0..63" in err
    code, _, err = tlab("sample", runs[1])
    assert code == 2 and "is an encoder" in " ".join(err.split())
    code, _, err = tlab("sample", tmp_path)
    assert code == 2 and "holds no trained model" in " ".join(err.split())


# --- tlab export --to-hf --------------------------------------------------------------------

def test_export_round_trip_with_transformers(llama_run, tmp_path):
    out = tmp_path / "hf"
    code, stdout, err = tlab("export", llama_run, "--to-hf", out)
    assert code == 0, err
    assert "LlamaForCausalLM, char tokenizer" in " ".join(stdout.split())
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    trained = load_trained(llama_run / WEIGHTS_FILE)
    assert tokenizer.encode(TEXT) == trained.tokenizer.encode(TEXT).tolist()
    assert tokenizer.decode(tokenizer.encode(VERSE)) == VERSE
    tokens = torch.tensor([tokenizer.encode(VERSE[:32])])
    with torch.no_grad():
        ours, theirs = trained.model(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max() <= 1e-4 * (1 + ours.abs().max())  # fp32 rounding
    # greedy continuation, token for token, against tlab sample --greedy
    prompt = tokenizer("Whether", return_tensors="pt").input_ids
    generated = hf.generate(prompt, max_new_tokens=30, do_sample=False)[0, prompt.shape[1]:]
    sampled = tlab("sample", llama_run, "--prompt", "Whether", "--tokens", "30", "--greedy",
                   "--no-echo")[1]
    assert generated.tolist() == trained.tokenizer.encode(sampled[:-1]).tolist()
    assert len(generated) == 30  # no end-of-text token stopped it: tlab has none
    code, _, err = tlab("export", llama_run, "--to-hf", out)  # never among existing files
    assert code == 2 and "holds files already" in " ".join(err.split())


@pytest.mark.parametrize("preset", ["llama", "mixtral", "gpt2", "gpt_neox"])
def test_every_causal_family_exports_with_the_same_logits(tmp_path, spec_for, preset):
    spec, task = spec_for("experiment=train", f"preset={preset}", "task=lm", "model.n_layers=1")
    model = build_model(spec.model, seed=0)
    with torch.no_grad():  # weights away from their initial values (e.g. norm gains at 1)
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn(parameter.shape, generator=torch.Generator()
                                             .manual_seed(parameter.numel())))
    weights = save_weights(model, tmp_path / "model.safetensors", spec, seed=0)
    code, stdout, err = tlab("export", weights, "--to-hf", tmp_path / "hf")
    assert code == 0, err
    assert "no tokenizer" in stdout
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokens = task.eval_batch().inputs[:4]
    with torch.no_grad():
        ours, theirs = model.eval()(tokens), hf(tokens).logits
    assert ours.abs().max() > 0.1  # a real comparison
    assert (ours - theirs).abs().max() <= 1e-4 * (1 + ours.abs().max())


@pytest.mark.parametrize(("overrides", "route", "why"), [
    ([], "GPTNeoXForCausalLM", "model.embed_scale=5.65685 folded into the token embedding table"),
    (["preset=bloom", "model.d_ff=128", "model.tie_embeddings=false", "model.embed_scale=sqrt"],
     "BloomForCausalLM", "model.embed_scale=5.65685 folded into the token embedding table"),
    (["preset=llama", "model.tie_embeddings=true", "model.embed_scale=sqrt"], "TlabForCausalLM",
     "LlamaForCausalLM cannot express this run's model.embed_scale=5.65685 (it has 1) (the "
     "output head shares the embedding table"),
    (["ffn=swiglu", "norm_layer=rmsnorm", "pe=alibi"], "TlabForCausalLM",
     "BloomForCausalLM cannot express this run's"),
    (["preset=llama", "pe.style=interleaved"], "TlabForCausalLM",
     "pe.style=interleaved (it has half)"),
    (["preset=gpt2", "ffn=relu", "model.tie_embeddings=false", "model.parallel_block=true"],
     "TlabForCausalLM", "model.parallel_block=true (it has false)"),
    (["preset=gpt2", "ffn=swish"], "TlabForCausalLM", "GPT2LMHeadModel cannot express this "
                                                      "run's ffn=swish (GPT-2 and GPT-NeoX have"),
    (["pe=t5"], "TlabForCausalLM", "no transformers causal LM has this run's components (pe=t5"),
])
def test_export_says_which_route_and_why(tmp_path, spec_for, overrides, route, why):
    """Every decoder exports: as its family where one computes it (a scale folded into an
    untied table), else with its own code; the console names the class and why."""
    spec, _ = spec_for("experiment=train", "task=lm", "model=small", "model.d_model=32",
                       *overrides)
    model = build_model(spec.model, seed=0)
    weights = save_weights(model, tmp_path / "model.safetensors", spec, 0)
    code, out, err = tlab("export", weights, "--to-hf", tmp_path / "hf")
    flat = " ".join(out.split())
    assert code == 0, err
    assert f"hf: {route}," in flat and why in flat, flat
    remote = route == "TlabForCausalLM"
    assert ((tmp_path / "hf" / "modeling_tlab.py").exists()) == remote
    assert ("trust_remote_code=True" in flat) == remote
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf",
                                                           trust_remote_code=remote).eval()
    tokens = torch.randint(0, spec.model.vocab_size, (2, 12),
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model.eval()(tokens), hf(tokens).logits
    assert (ours - theirs).abs().max() <= 1e-4 * (1 + ours.abs().max())


@pytest.mark.parametrize("n_head", [4, 6])  # 6: no power of two (BLOOM's extra slopes)
def test_a_bloom_checkpoint_imports_with_the_same_logits(n_head):
    from transformer_lab.interop.hf import from_hf

    config = transformers.BloomConfig(vocab_size=80, hidden_size=8 * n_head, n_layer=2,
                                      n_head=n_head)
    torch.manual_seed(n_head)
    hf = transformers.BloomForCausalLM(config).eval()
    with torch.no_grad():  # away from the initial values (norm gains 1, biases 0)
        for parameter in hf.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape))
    spec, model = from_hf(hf)
    assert spec.pe.name == "alibi" and spec.embed_norm and spec.ffn.name == "gelu_tanh"
    tokens = torch.randint(0, 80, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(tokens), hf(tokens).logits
    assert ours.abs().max() > 1.0
    assert (ours - theirs).abs().max() <= 1e-4 * (1 + ours.abs().max())


def test_export_refuses_an_encoder(tmp_path, spec_for):
    spec, _ = spec_for("experiment=train", "task=reverse", "arch=encoder", "model=tiny")
    weights = save_weights(build_model(spec.model, seed=0), tmp_path / "model.safetensors",
                           spec, 0)
    code, out, err = tlab("export", weights, "--to-hf", tmp_path / "hf")
    flat = " ".join(err.split())
    assert code == 2 and "this run's model is an encoder" in flat, err
    assert len(err.strip().splitlines()) <= 3 and not (tmp_path / "hf").exists()


class ShiftedSinusoidal(torch.nn.Module):
    """A PE of the user's own (not tlab's to bundle)."""

    kind = "additive"

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(max_len, d_model))

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


def test_export_refuses_a_component_of_your_own(tmp_path, spec_for):
    from transformer_lab.interop.hf_export import export_model

    target = f"{__name__}.ShiftedSinusoidal"
    spec, _ = spec_for("experiment=train", "task=lm", "model=tiny", "pe=sinusoidal",
                       f"pe._target_={target}", "~pe.base")
    with pytest.raises(ConfigError, match=f"pe=sinusoidal is your own component "
                                          f"\\(_target_={target}\\)"):
        export_model(build_model(spec.model, seed=0).eval(), spec.model, tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["char", "byte", "bpe"])
def test_exported_tokenizers_encode_as_tlabs(tmp_path, kind):
    from transformer_lab.interop.hf_tokenizer import byte_alphabet, hf_tokenizer

    text = TEXT + "  indented\r\nwindows line\ttab\x0cform feed, ünïcödé ✓ 日本語\n\n\n   end"
    tokenizer = {"char": lambda: CharTokenizer.fit(text), "byte": ByteTokenizer,
                 "bpe": lambda: train_bpe(text, 300)}[kind]()
    hf_tokenizer(tokenizer).save_pretrained(tmp_path)
    loaded = transformers.AutoTokenizer.from_pretrained(tmp_path)
    for sample in (text, VERSE[:50], "\n\n  e\r\n", "a"):
        assert loaded.encode(sample) == tokenizer.encode(sample).tolist(), (kind, sample)
        assert loaded.decode(loaded.encode(sample)) == sample
    from tokenizers.pre_tokenizers import ByteLevel

    assert sorted(byte_alphabet().values()) == sorted(ByteLevel.alphabet())


# --- --from-run -----------------------------------------------------------------------------

def test_check_and_extrapolate_from_a_run(llama_run, tmp_path):
    out = tmp_path / "check"
    assert main(["experiment=check", f"from_run={llama_run}", "arch=encoder",
                 f"hydra.run.dir={out}", "logger.progress=false"]) == 0
    rows = read_csv(out / "checks.csv")
    assert rows and {r["status"] for r in rows} == {"PASS"}
    assert all("rope" in r["component"] for r in rows)  # the run's own PE only
    config = (out / "config.yaml").read_text()
    assert f"from_run: {llama_run / WEIGHTS_FILE}" in config and "n_kv_heads: 2" in config

    out = tmp_path / "extrapolate"
    text = llama_run.parent / "verse.txt"
    assert main(["experiment=extrapolate", f"from_run={llama_run}", "task=text",
                 f"task.path={text}", "task.seq_len=32", "task.eval_size=32",
                 "routine.eval_lens=[1x,2x]", f"hydra.run.dir={out}",
                 "logger.progress=false"]) == 0
    at_train_len = [r for r in read_csv(out / "extrapolation.csv") if r["eval_len"] == "32"]
    (summary,) = read_csv(llama_run / "summary.csv")
    # the run's own held-out windows at its own length: its final held-out loss, untrained here
    assert float(at_train_len[0]["loss"]) == pytest.approx(float(summary["final_loss"]),
                                                           rel=1e-5)
    assert at_train_len[0]["train_steps"] == "0"


def test_plot_pe_from_a_run_draws_its_trained_table(tmp_path):
    run = trained_run(tmp_path, "gpt2", "preset=gpt2", "model.n_layers=1", "model.d_model=16",
                      "model.max_len=32", "train.steps=10")
    out = tmp_path / "plot"
    code, _, err = tlab("plot-pe", "--from-run", run, "--max-len", "32", "--dims", "0,5",
                        "--out", out, "-q")
    assert code == 0, err
    table = load_trained(run / WEIGHTS_FILE).model.positional.weight.detach().numpy()  # (32, 16)
    rows = read_csv(out / "pe_values.csv")
    drawn = np.array([[float(r["dim 0"]), float(r["dim 5"])] for r in rows])
    np.testing.assert_allclose(drawn, table[:, [0, 5]], rtol=1e-5, atol=1e-7)  # CSV: 6 digits
    initial = build_model(load_trained(run / WEIGHTS_FILE).spec.model, seed=0).positional.weight
    assert not np.allclose(drawn, initial.detach().numpy()[:, [0, 5]])  # trained, not initial


def test_from_run_refusals(llama_run, tmp_path):
    several = tmp_path / "several"
    assert main(["experiment=train", "model=tiny", "task=lm", "train.steps=3", "routine.seeds=2",
                 "logger.progress=false", f"hydra.run.dir={several}"]) == 0
    for args, expected in (
            (["--from-run", several], "holds 2 models; give one of its files: "
                                      f"{several / 'models' / 'seed0.safetensors'}"),
            (["--from-run", tmp_path / "nothing"], "no such run directory or weights file"),
            (["--from-run", llama_run, "--from-hf", llama_run], "give one of them"),
            (["--from-run", llama_run, "--pe", "alibi"], "pe=alibi: --from-run builds the "
                                                          "checkpoint's own pe (rope)")):
        code, _, err = tlab("check", *args, "--out", tmp_path / "out")
        assert code == 2 and expected in " ".join(err.split()), err
        assert not (tmp_path / "out").exists()
    code, _, err = tlab("check", "--from-run", several / "models" / "seed1.safetensors",
                        "--out", tmp_path / "one", "-q")
    # one file of several runs (a 3-step model may fail a check: exit 1 is a verdict, not a refusal)
    assert code in (0, 1) and (tmp_path / "one" / "checks.csv").exists(), err
    assert "seed1.safetensors" in (tmp_path / "one" / "config.yaml").read_text()
