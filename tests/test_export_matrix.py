"""``tlab export --to-hf`` of any decoder (issue 30): a pairwise covering set of PE x block x
norm layer x FFN x tied head, plus the presets of the ``transformers`` families, each exported
by the command line and loaded by ``transformers`` in a separate Python where tlab cannot be
imported: the same logits (fp32 rounding) and the greedy continuation of ``tlab sample
--greedy``, token for token."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.training.checkpoint import save_weights

pytest.importorskip("transformers", reason="transformers is not installed")

FACTORS = {"pe": ["none", "sinusoidal", "learned", "rope", "alibi", "t5"],
           "block": ["pre", "post", "sandwich", "deepnorm"],
           "norm_layer": ["layernorm", "rmsnorm"],
           "ffn": ["gelu", "swiglu", "geglu", "moe"],
           "model.tie_embeddings": ["false", "true"]}
PRESETS = ["llama", "mixtral", "gpt2", "gpt_neox", "bloom"]
TINY = ["experiment=train", "task=lm", "model.d_model=16", "model.n_heads=2", "model.n_layers=2",
        "model.d_ff=64", "model.max_len=32"]
PROMPT, NEW_TOKENS, PROBE = [3, 1, 4, 1, 5], 12, (2, 16)  # PROBE: (B, T) of the logits check
# The loader: a fresh Python with tlab made unimportable (the editable install too).
LOADER = """
import sys
sys.modules["transformer_lab"] = None
import json, torch, transformers
out = {}
for name, directory in json.loads(sys.argv[1]).items():
    remote = (transformers.AutoConfig.from_pretrained(directory, trust_remote_code=True)
              .model_type == "tlab")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        directory, trust_remote_code=remote, local_files_only=True).eval()
    probe = torch.load(directory + "/probe.pt")
    with torch.no_grad():
        logits = hf(probe["tokens"]).logits
    prompt = torch.tensor([probe["prompt"]])
    greedy = hf.generate(prompt, max_new_tokens=probe["new"], do_sample=False,
                         attention_mask=torch.ones_like(prompt))[0, prompt.shape[1]:]
    out[name] = {"class": type(hf).__name__, "greedy": greedy.tolist(),
                 "difference": (logits - probe["logits"]).abs().max().item()}
print(json.dumps(out))
"""


def pairwise_rows(factors: dict[str, list[str]]) -> list[dict[str, str]]:
    """A small set of rows (greedy, deterministic) in which every pair of values of any two
    factors appears at least once."""
    names = list(factors)
    uncovered = {((a, x), (b, y)) for a, b in itertools.combinations(names, 2)
                 for x in factors[a] for y in factors[b]}
    pairs = list(itertools.combinations(names, 2))
    rows: list[dict[str, str]] = []
    candidates = [dict(zip(names, values, strict=True))
                  for values in itertools.product(*factors.values())]
    while uncovered:
        gains = [sum(((a, row[a]), (b, row[b])) in uncovered for a, b in pairs)
                 for row in candidates]
        best = candidates[gains.index(max(gains))]
        rows.append(best)
        uncovered -= {((a, best[a]), (b, best[b])) for a, b in pairs}
    return rows


ROWS = pairwise_rows(FACTORS)
ARCHITECTURES = {" ".join(f"{k}={v}" for k, v in row.items()): [f"{k}={v}" for k, v in row.items()]
                 for row in ROWS}
ARCHITECTURES.update({f"preset={p}": [f"preset={p}"] for p in PRESETS})


def test_the_rows_cover_every_pair():
    for a, b in itertools.combinations(FACTORS, 2):
        seen = {(row[a], row[b]) for row in ROWS}
        assert seen == set(itertools.product(FACTORS[a], FACTORS[b])), (a, b)
    assert len(ROWS) < len(list(itertools.product(*FACTORS.values()))) / 4  # a real saving


def tlab(*args: str | Path) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, dict]:
    """Each architecture: random weights away from their initial values, saved as a run's
    weights, exported by ``tlab export``, continued by ``tlab sample --greedy``; then one
    subprocess loads every export with transformers alone."""
    root = tmp_path_factory.mktemp("matrix")
    results, directories = {}, {}
    for index, (name, overrides) in enumerate(ARCHITECTURES.items()):
        spec = RunSpec.of(compose([*TINY, *overrides]))
        spec = spec.with_vocab(build_task(spec).vocab_size)
        model = build_model(spec.model, seed=index)
        generator = torch.Generator().manual_seed(index)
        with torch.no_grad():  # not the initial values (norm gains 1, biases 0, tiny weights)
            for parameter in model.parameters():
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
        weights = save_weights(model, root / f"{index}.safetensors", spec, seed=0)
        out = root / f"hf{index}"
        code, stdout, err = tlab("export", weights, "--to-hf", out)
        assert code == 0, (name, err)
        code, sampled, err = tlab("sample", weights, "--prompt", " ".join(map(str, PROMPT)),
                                  "--tokens", NEW_TOKENS, "--greedy")
        assert code == 0, (name, err)
        tokens = torch.randint(0, spec.model.vocab_size, PROBE, generator=generator)
        with torch.no_grad():
            logits = model.eval()(tokens)  # (B, T, vocab)
        torch.save({"tokens": tokens, "logits": logits, "prompt": PROMPT, "new": NEW_TOKENS},
                   out / "probe.pt")
        results[name] = {"console": " ".join(stdout.split()), "logits": logits,
                         "sampled": [int(t) for t in sampled.split()][-NEW_TOKENS:]}
        directories[name] = str(out)
    loaded = subprocess.run([sys.executable, "-I", "-c", LOADER, json.dumps(directories)],
                            cwd=root, capture_output=True, text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    for name, row in json.loads(loaded.stdout.strip().splitlines()[-1]).items():
        results[name].update(row)
    return results


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_transformers_computes_the_runs_model(exported, name):
    row = exported[name]
    logits = row["logits"]
    assert logits.abs().max() > 1.0  # weights far from trivial: a real comparison
    # fp32 rounding of logits of this size through a few layers' matmuls, norms and softmaxes
    assert row["difference"] <= 1e-4 * (1 + logits.abs().max().item()), row["difference"]
    assert row["greedy"] == row["sampled"]  # tlab sample --greedy, token for token
    remote = row["class"] == "TlabForCausalLM"
    assert (f"{row['class']}," in row["console"]) and ("why:" in row["console"])
    assert ("trust_remote_code=True" in row["console"]) == remote
    if name.startswith("preset="):  # a family's own components: its own class
        assert not remote, row["console"]
