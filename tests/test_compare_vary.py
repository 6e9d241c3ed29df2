"""``tlab compare --vary KEY=V1,V2,...``: a variant per value of a group or a key, the same
seeds, data and (where shapes allow) initial weights; the verdict columns, the parameter flag,
refusals in pre-flight; ``compare-activations`` is ``--vary ffn=...``."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.measures.statistics import VERDICT_COLUMNS
from transformer_lab.model import build_model
from transformer_lab.routines.compare import start_from, variant_specs

# The tiny model on the offline synthetic language: a fraction of a second per (variant, seed).
FAST = ["task=lm", "model=tiny", "task.eval_size=32", "train.batch_size=8", "train.lr=1e-2"]
# The floor of comparison.csv's columns (DESIGN.md) and the verdict columns.
FLOOR = ["activation", "params", "ffn_params", "tokens_per_s", "rel_speed", "final_loss",
         "final_ppl", "grad_norm_mean", "grad_norm_std", "steps_to_target", "seeds",
         "final_loss_ci_low", "final_loss_ci_high", *VERDICT_COLUMNS]
TIMINGS = {"tokens_per_s", "rel_speed", "wall_s"}


def compare(*args: str) -> tuple[int, str]:
    """``tlab compare ARGS`` through the command line (its --vary parsing included)."""
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.output


def test_vary_a_group_gives_a_variant_per_choice_with_verdict_columns(tmp_path):
    out = tmp_path / "cmp"
    code, output = compare("--vary", "pe=rope,alibi,t5", "--seeds", "2", "--steps", "8", *FAST,
                           "--out", str(out))
    assert code == 0, output
    rows = read_csv(out / "comparison.csv")
    assert [r["variant"] for r in rows] == ["rope", "alibi", "t5"]
    assert set(FLOOR) <= set(rows[0]) and "varied" in rows[0]
    assert {(r["varied"], r["activation"]) for r in rows} == {("pe", "gelu")}
    assert [r["verdict"] for r in rows][0] == "baseline"
    for row in rows[1:]:
        assert row["verdict"] in ("better", "worse", "no detectable difference")
        assert math.isfinite(float(row["diff_vs_baseline"])) and row["paired_seeds"] == "2"
    runs = read_csv(out / "compare_runs.csv")
    assert sorted((r["variant"], r["seed"]) for r in runs) == sorted(
        (pe, seed) for pe in ("rope", "alibi", "t5") for seed in ("0", "1"))
    assert (out / "loss_curves.png").stat().st_size > 1000
    metrics = read_csv(out / "metrics.csv")
    assert {(r["variant"], r["seed"]) for r in metrics} == {(r["variant"], r["seed"])
                                                            for r in runs}
    assert "t5" in output and "baseline" in output  # the terminal table


def test_vary_a_key_trains_the_same_model_on_the_same_data(tmp_path):
    """Two learning rates: the same initial weights and first batch, so the same first loss
    (before any update) for each seed, then different losses."""
    out = tmp_path / "lr"
    code, output = compare("--vary", "train.lr=1e-3,3e-2", "--seeds", "2", "--steps", "6",
                           *FAST, "--out", str(out))
    assert code == 0, output
    runs = read_csv(out / "compare_runs.csv")
    by = {(r["variant"], r["seed"]): r for r in runs}
    assert {variant for variant, _ in by} == {"0.001", "0.03"}
    for seed in ("0", "1"):
        assert by["0.001", seed]["first_loss"] == by["0.03", seed]["first_loss"]
        assert by["0.001", seed]["final_loss"] != by["0.03", seed]["final_loss"]
    assert by["0.001", "0"]["first_loss"] != by["0.001", "1"]["first_loss"]  # seeds differ
    assert [r["varied"] for r in read_csv(out / "comparison.csv")] == ["train.lr"] * 2


def test_shape_compatible_parameters_start_equal_across_variants(spec_for):
    """A learned PE's table is drawn before the blocks, so seeding alone gives the blocks other
    weights than NoPE's; start_from copies every parameter whose name and shape match."""
    spec, _ = spec_for("experiment=compare", *FAST, "routine.vary.key=pe",
                       "routine.vary.values=[none,learned]")
    (_, nope), (_, learned) = variant_specs(spec)
    first, second = build_model(nope.model, seed=3), build_model(learned.model, seed=3)
    shared = dict(first.named_parameters())
    assert not torch.equal(second.blocks[0].attention.out_proj.weight,
                           shared["blocks.0.attention.out_proj.weight"])
    table = second.positional.weight.detach().clone()
    copied = start_from(second, {n: p.detach() for n, p in shared.items()})
    assert set(copied) == set(shared)  # every NoPE parameter has its twin in the learned model
    for name, parameter in second.named_parameters():
        if name in shared:
            assert torch.equal(parameter, shared[name]), name
    assert torch.equal(second.positional.weight, table)  # its own table stays


@pytest.mark.parametrize("shared", [True, False])
def test_compare_shares_initial_weights_between_variants(tmp_path, shared):
    """pe=none vs a learned PE scaled to 0 (model.pe_scale=0): the same function exactly when
    the other weights are the same, so the first losses agree with shared weights only."""
    out = tmp_path / "run"
    code, output = compare("--vary", "pe=none,learned", "--seeds", "2", "--steps", "8", *FAST,
                           "model.pe_scale=0",
                           f"routine.shared_init={str(shared).lower()}",
                           "--out", str(out))
    assert code == 0, output
    by = {(r["variant"], r["seed"]): r["first_loss"] for r in read_csv(out / "compare_runs.csv")}
    same = [by["none", seed] == by["learned", seed] for seed in ("0", "1")]
    assert same == [shared, shared]


def test_parameter_counts_more_than_5_percent_apart_are_flagged(tmp_path):
    out = tmp_path / "gated"
    code, output = compare("--vary", "ffn=relu,swiglu", "--seeds", "1", "--steps", "6", *FAST,
                           "--out", str(out))
    assert code == 0, output
    relu, swiglu = read_csv(out / "comparison.csv")
    assert relu["params_note"] == "" and float(relu["params_vs_baseline"]) == 0.0
    extra = int(swiglu["params"]) / int(relu["params"]) - 1
    assert extra > 0.05 and float(swiglu["params_vs_baseline"]) == pytest.approx(extra, rel=1e-5)
    assert "model.gated_match_params=true" in swiglu["params_note"]
    assert "!" in output and "model.gated_match_params=true" in " ".join(output.split())
    out = tmp_path / "matched"
    code, output = compare("--vary", "ffn=relu,swiglu", "--seeds", "1", "--steps", "6", *FAST,
                           "model.gated_match_params=true", "--out", str(out))
    assert code == 0, output
    _, swiglu = read_csv(out / "comparison.csv")
    assert abs(float(swiglu["params_vs_baseline"])) <= 0.05 and swiglu["params_note"] == ""
    out = tmp_path / "moe"
    code, output = compare("--vary", "ffn=relu,moe", "--seeds", "1", "--steps", "6", *FAST,
                           "--out", str(out))
    assert code == 0, output
    _, moe = read_csv(out / "comparison.csv")
    assert "ffn.n_experts" in moe["params_note"]  # many times the FFN: not the gated 3/2


@pytest.mark.parametrize(("args", "message"), [
    (["--vary", "pe=rope,rotary"], "unknown pe 'rotary' in --vary pe; valid: alibi"),
    (["--vary", "train.lrr=1e-3,1e-2"], "unknown key 'train.lrr'"),
    (["--vary", "train.lr=abc,1e-3"], "--vary train.lr=abc: train.lr=abc is not valid"),
    (["--vary", "ffn=gelu,relu,gelu"], "--vary ffn lists gelu twice"),
    (["--vary", "pe=rope,alibi", "--baseline", "t5"], "--baseline t5 is not among"),
    (["--vary", "seed=1,2"], "'seed' is not a setting of the model"),
    (["--vary", "model.n_heads=2,3"], "--vary model.n_heads=3: model.d_model=8 is not divisible"),
    (["--vary", "optimizer=adamw,lion"], "unknown optimizer 'lion'"),
    ([], "tlab compare needs --vary KEY=V1,V2"),
    (["--vary", "pe=rope", "--vary", "ffn=relu"], "--vary is given 2 times (pe, ffn)"),
    (["--vary", "pe"], "--vary 'pe' is not KEY=V1,V2,..."),
])
def test_bad_variations_are_refused_before_anything_is_written(tmp_path, args, message):
    out = tmp_path / "bad"
    result = CliRunner().invoke(app, ["compare", *args, *FAST, "--out", str(out)])
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.split())
    assert message in flat and flat.startswith("error:") and "Traceback" not in flat
    assert len(result.output.strip().splitlines()) <= 3  # one line, wrapped at most twice
    assert not out.exists()


def test_vary_is_one_list_not_a_hydra_sweep(tlab, tmp_path):
    """With -m the other overrides sweep (two jobs), each job compares every value."""
    sweep = tmp_path / "sweep"
    code, output = compare("-m", "--vary", "pe=rope,alibi", "--seeds", "1", "--steps", "6",
                           *FAST, "train.lr=1e-3,1e-2", "--out", str(sweep))
    assert code == 0, output
    jobs = sorted(p for p in sweep.iterdir() if (p / "comparison.csv").exists())
    assert len(jobs) == 2
    for job in jobs:
        assert [r["variant"] for r in read_csv(job / "comparison.csv")] == ["rope", "alibi"]


def test_compare_activations_is_compare_vary_ffn(tlab, tmp_path):
    """The same comparison through both commands: the same columns and numbers (timings
    aside); compare-activations keeps its own defaults (reversal, encoder) and its files."""
    common = ["model=tiny", "model.d_model=16", "task.seq_len=8", "train.batch_size=8",
              "routine.seeds=2", "routine.steps=10"]
    code, _, err = tlab("experiment=compare_activations", "routine.activations=[relu,gelu]",
                        *common, f"hydra.run.dir={tmp_path / 'activations'}")
    assert code == 0, err
    # compare-activations' defaults spelled out on top of compare's (tlab train's setup)
    same_setup = ["task=reverse", "arch=encoder", "task.vocab_size=16", "train.lr=3e-3",
                  "train.schedule=constant", "train.warmup=0", "routine.shared_init=false"]
    code, output = compare("--vary", "ffn=relu,gelu", *same_setup, *common,
                           "--out", str(tmp_path / "vary"))
    assert code == 0, output
    for table in ("comparison", "compare_runs"):
        old, new = (read_csv(tmp_path / run / f"{table}.csv") for run in ("activations", "vary"))
        assert list(old[0]) == list(new[0])
        for a, b in zip(old, new, strict=True):
            assert {k: v for k, v in a.items() if k not in TIMINGS | {"wall_s"}} == \
                   {k: v for k, v in b.items() if k not in TIMINGS | {"wall_s"}}
    rows = read_csv(tmp_path / "activations" / "comparison.csv")
    assert set(FLOOR) <= set(rows[0])
    assert [(r["activation"], r["variant"]) for r in rows] == [("relu", "relu"), ("gelu", "gelu")]
    assert (tmp_path / "activations" / "loss_curves.png").exists()
