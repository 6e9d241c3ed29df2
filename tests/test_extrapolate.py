"""Tests for ``tlab extrapolate`` (transformer_lab.routines.extrapolate).

Reference frequencies are computed here from the papers' formulas in plain Python, independently
of ``rope_scaling.py``; the CSV tests run the real routine on a tiny model.
"""

from __future__ import annotations

import contextlib
import math
import re
from pathlib import Path

import pytest
import torch
from helpers import read_csv

from transformer_lab.cli.common import hydra_list
from transformer_lab.config.compose import compose
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.model import build_model
from transformer_lab.routines.extrapolate import (
    EXTRAPOLATION_COLUMNS,
    Scaling,
    make_plan,
    parse_eval_length,
    parse_scaling,
    scaled_model,
    task_at,
    training_spec,
)
from transformer_lab.tasks import ReverseTask

TINY = ["model=tiny", "train.steps=12", "train.lr=2e-2", "task.eval_size=16", "routine.train_len=3",
        "train.log_every=4"]



def extrapolate_spec(*overrides: str) -> RunSpec:
    return RunSpec.of(compose(["experiment=extrapolate", *TINY, *overrides]))


# --------------------------------------------------------------------------------------------
# parsing


def test_eval_lengths_multiples_and_tokens() -> None:
    assert parse_eval_length("1x", 8) == 8
    assert parse_eval_length("2x", 8) == 16
    assert parse_eval_length(" 1.5x", 8) == 12
    assert parse_eval_length("0.5x", 8) == 4
    assert parse_eval_length(24, 8) == 24
    assert parse_eval_length("24", 8) == 24
    for bad in ("0x", 0, -3, "0"):
        with pytest.raises(ConfigError, match=r"at least 1"):
            parse_eval_length(bad, 8)
    with pytest.raises(ConfigError, match=r"'abc' is not a length.*2x"):
        parse_eval_length("abc", 8)


def test_scaling_entries() -> None:
    assert parse_scaling("yarn") == Scaling("yarn")
    assert parse_scaling("linear:2") == Scaling("linear", 2.0)
    assert parse_scaling("base:500000") == Scaling("base", 500000.0)
    assert parse_scaling("yarn:4").label == "yarn:4"
    for bad, message in (("linear:0", r"factor=0 .*> 0"), ("ntk:-2", r"factor=-2"),
                         ("foo", r"'foo' is not a RoPE scaling; valid: none, linear, ntk, "
                                 r"dynamic, yarn, llama3, base:N"),
                         ("base", r"base:500000"), ("base:1", r"> 1"), ("yarn:x", r"number"),
                         ("none:2", r"no factor")):
        with pytest.raises(ConfigError, match=message):
            parse_scaling(bad)


def test_scaling_settings_default_factor_is_the_length_ratio() -> None:
    assert Scaling("none").pe_settings(4.0, 16) == {}
    for name in ("linear", "ntk", "yarn"):
        assert Scaling(name).pe_settings(4.0, 16) == {
            "scaling": name, "factor": 4.0, "original_max_len": 16}
        assert Scaling(name).pe_settings(0.5, 16)["factor"] == 1.0  # never below 1
    assert Scaling("dynamic").pe_settings(4.0, 16)["factor"] == 1.0  # s = L'/L per length
    assert Scaling("yarn", 8.0).pe_settings(2.0, 16)["factor"] == 8.0
    assert Scaling("base", 5e5).pe_settings(2.0, 16) == {"base": 5e5}


def test_hydra_list() -> None:
    assert hydra_list("1x, 2x,4x") == "[1x,2x,4x]"
    assert hydra_list("rope") == "[rope]"
    assert hydra_list(None) is None


def test_plan_reads_routine_settings() -> None:
    spec = extrapolate_spec("routine.pes=[rope,alibi]", "routine.eval_lens=[4x,1x,2x,6]",
                            "routine.scalings=[none,yarn]", "routine.seeds=2", "seed=5")
    plan = make_plan(spec)
    assert plan.pes == ["rope", "alibi"] and plan.train_len == 3
    assert plan.eval_lens == [3, 6, 12]  # sorted, 2x and 6 are the same length
    assert plan.seeds == [5, 6]
    assert [s.label for s in plan.scalings_for("rope")] == ["none", "yarn"]
    assert [s.label for s in plan.scalings_for("alibi")] == ["none"]
    assert plan.pe_specs["rope"] is spec  # the run's own PE: its spec, overrides kept
    assert plan.pe_specs["alibi"].model.pe.name == "alibi" != spec.model.pe.name
    assert make_plan(extrapolate_spec()).pes == ["rope"]  # null: the pe group choice


# --------------------------------------------------------------------------------------------
# tasks and scaled models per length


def test_task_per_eval_length_generates_that_length() -> None:
    spec = extrapolate_spec()
    for length in (3, 6, 12):
        task = task_at(spec, length, "test")
        batch = task.eval_batch()
        assert task.model_seq_len == 2 * length  # decoder: source SEP target, shifted
        assert batch.inputs.shape == (16, 2 * length)
        assert (batch.targets[:, length:] != -100).all()
        assert (batch.targets[:, :length] == -100).all()
        assert torch.equal(batch.targets[:, length:], batch.inputs[:, :length].flip(1))
    encoder = extrapolate_spec("arch=encoder")
    assert task_at(encoder, 12, "test").eval_batch().inputs.shape == (16, 12)


def test_training_spec_keeps_the_runs_pe_overrides_and_sets_the_lengths() -> None:
    spec = extrapolate_spec("pe.base=500000", "routine.pes=[rope,learned]", "routine.max_len=40")
    plan = make_plan(spec)
    train_task = task_at(spec, plan.train_len, "test")
    rope = training_spec(plan, "rope", train_task)
    assert rope.model.pe["base"] == 500000  # the command line's, not rope.yaml's 10000
    assert (rope.task["seq_len"], rope.model.max_len) == (3, 40)
    learned = training_spec(plan, "learned", train_task)  # from its choice file
    assert learned.model.pe["max_len"] == learned.model.max_len == 40  # resolved in the variant
    assert learned.model.vocab_size == train_task.vocab_size


def _rope(d: int, base: float) -> list[float]:
    return [base ** (-2 * i / d) for i in range(d // 2)]


def _yarn(d: int, base: float, s: float, orig: int, beta_fast=32.0, beta_slow=1.0) -> list[float]:
    """Peng et al. 2023, as in their code: pairs that turn more than beta_fast times over the
    original length keep theta_i, fewer than beta_slow times get theta_i / s, a linear ramp over
    the pair index between (bounds rounded outwards)."""

    def pair_with_rotations(r: float) -> float:  # solve orig / (2 pi base^(2i/d)) = r for i
        return d * math.log(orig / (2 * math.pi * r)) / (2 * math.log(base))

    low = max(math.floor(pair_with_rotations(beta_fast)), 0)
    high = min(math.ceil(pair_with_rotations(beta_slow)), d - 1)
    high = high + 0.001 if high == low else high
    out = []
    for i, theta in enumerate(_rope(d, base)):
        interpolated = min(max((i - low) / (high - low), 0.0), 1.0)
        out.append(theta * (1 - interpolated) + theta / s * interpolated)
    return out


@pytest.mark.parametrize("scaling", ["linear", "ntk", "yarn", "dynamic", "base:500000"])
def test_scaled_model_frequencies_follow_the_papers(scaling: str) -> None:
    """Model trained at L (decoder: 2 * train_len positions), RoPE rebuilt for L' = 4L."""
    spec = extrapolate_spec("model=small", "model.d_model=32", "model.n_heads=2")  # head_dim 16
    plan = make_plan(spec)
    train_task = task_at(spec, 3, "test")
    assert train_task.model_seq_len == 6
    spec_pe = training_spec(plan, "rope", train_task)
    assert (spec_pe.model.max_len, spec_pe.model.vocab_size) == (6, train_task.vocab_size)
    model = build_model(spec_pe.model)
    parsed = parse_scaling(scaling)
    scaled = scaled_model(model, spec_pe.model.pe, parsed.pe_settings(4.0, original_max_len=6))
    assert scaled.positional is not model.positional
    assert model.positional.scaling == "none"  # the trained model is untouched
    assert scaled.lm_head.weight is model.lm_head.weight  # weights shared, not retrained
    d, s = 16, 4.0
    expected_scale = 1.0
    if scaling == "linear":  # Chen et al. 2023: positions * L/L'
        expected = [t / s for t in _rope(d, 10000.0)]
    elif scaling == "ntk":  # bloc97: base' = base * s^(d/(d-2))
        expected = _rope(d, 10000.0 * s ** (d / (d - 2)))
    elif scaling == "yarn":
        expected = _yarn(d, 10000.0, s, 6)
        expected_scale = 0.1 * math.log(s) + 1.0  # sqrt(1/t)
    elif scaling == "dynamic":  # unchanged until the sequence is longer than L
        expected = _rope(d, 10000.0)
    else:
        expected = _rope(d, 500000.0)
    got = scaled.positional.inv_freq.double()
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5)
    assert scaled.positional.attention_scale == pytest.approx(expected_scale)
    if scaling == "dynamic":  # at L' = 24 positions: s = 24 / 6 = 4, the NTK base
        tokens = torch.randint(1, 10, (1, 24))
        scaled(tokens)
        assert torch.allclose(scaled.positional.inv_freq.double(),
                              torch.tensor(_rope(d, 10000.0 * 4.0 ** (d / (d - 2))),
                                           dtype=torch.float64), rtol=1e-5)


# --------------------------------------------------------------------------------------------
# the command end to end (tiny)


def test_extrapolate_writes_csv_and_plot(tlab, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, stdout, err = tlab(
        "experiment=extrapolate", *TINY, "routine.pes=[rope,alibi,learned]",
        "routine.eval_lens=[1x,2x]", "routine.scalings=[none,linear]",
        "routine.finetune_steps=3", f"hydra.run.dir={out}")
    assert code == 0, err
    assert "learned" in stdout and "error" in stdout  # the learned table cannot reach 2x
    rows = read_csv(out / "extrapolation.csv")
    header = list(rows[0].keys())
    assert header[:8] == ["pe", "scaling", "train_len", "eval_len", "loss", "accuracy",
                          "exact_match", "seed"]
    assert header == EXTRAPOLATION_COLUMNS
    keys = [(r["pe"], r["scaling"], r["eval_len"], r["finetune_steps"]) for r in rows]
    assert sorted(keys) == sorted([
        ("rope", "none", "3", "0"), ("rope", "linear", "3", "0"),
        ("rope", "none", "6", "0"), ("rope", "none", "6", "3"),
        ("rope", "linear", "6", "0"), ("rope", "linear", "6", "3"),
        ("alibi", "none", "3", "0"), ("alibi", "none", "6", "0"), ("alibi", "none", "6", "3"),
        ("learned", "none", "3", "0"), ("learned", "none", "6", "0"),
        ("learned", "none", "6", "3"),
    ])
    by_key = {(r["pe"], r["scaling"], r["eval_len"], r["finetune_steps"]): r for r in rows}
    for row in rows:
        assert row["train_len"] == "3" and row["seed"] == "0"
        assert row["model_seq_len"] == str(2 * int(row["eval_len"]))  # decoder: 2L positions
        if row["pe"] == "learned" and row["eval_len"] == "6":
            assert row["status"] == "error"
            assert "max_len=6" in row["error"] and row["loss"] == ""
            continue
        assert row["status"] == "ok", row
        assert math.isfinite(float(row["loss"]))
        assert 0.0 <= float(row["accuracy"]) <= 1.0 and 0.0 <= float(row["exact_match"]) <= 1.0
    def loss(*key: str) -> str:
        return by_key[key]["loss"]

    # linear at 1x has factor 1: the same model and numbers as none; at 2x factor 2 changes them
    assert by_key[("rope", "linear", "3", "0")]["factor"] == "1"
    assert loss("rope", "linear", "3", "0") == loss("rope", "none", "3", "0")
    assert by_key[("rope", "linear", "6", "0")]["factor"] == "2"
    assert loss("rope", "linear", "6", "0") != loss("rope", "none", "6", "0")
    # fine-tuning changed the model
    assert loss("rope", "none", "6", "3") != loss("rope", "none", "6", "0")
    # no retraining: the 1x row is the trainer's own final held-out evaluation
    metrics = read_csv(out / "metrics.csv")
    for pe in ("rope", "alibi", "learned"):
        val = [m for m in metrics if m["pe"] == pe and m["split"] == "val"
               and m["phase"] == "train"]
        assert float(val[-1]["loss"]) == pytest.approx(
            float(by_key[(pe, "none", "3", "0")]["loss"]), rel=1e-4)
    assert {m["phase"] for m in metrics} == {"train", "finetune"}
    assert (out / "extrapolation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = read_csv(out / "summary.csv")[0]
    assert summary["status"] == "passed" and summary["pe"] == "rope,alibi,learned"


def test_extrapolate_is_deterministic_and_learned_interpolates(tlab, tmp_path: Path) -> None:
    args = ["experiment=extrapolate", *TINY, "pe=learned", "pe.interpolate=true",
            "routine.eval_lens=[1x,2x]", "train.steps=6"]
    tables = []
    for name in ("a", "b"):
        code, _, err = tlab(*args, f"hydra.run.dir={tmp_path / name}")
        assert code == 0, err
        tables.append(read_csv(tmp_path / name / "extrapolation.csv"))
    assert tables[0] == tables[1]
    assert [r["status"] for r in tables[0]] == ["ok", "ok"]  # interpolated past the table


def test_seed_init_and_seed_data_set_each_seeds_training_and_finetuning(tlab, tmp_path: Path
                                                                         ) -> None:
    """``seed=1`` is ``seed_init=1 seed_data=1`` for every seed: the same numbers."""
    args = ["experiment=extrapolate", *TINY, "train.steps=2", "routine.seeds=2",
            "routine.eval_lens=[1x,2x]", "routine.finetune_steps=2"]
    losses = []
    for name, overrides in (("plain", ["seed=1"]), ("sources", ["seed_init=1", "seed_data=1"])):
        code, _, err = tlab(*args, *overrides, f"hydra.run.dir={tmp_path / name}")
        assert code == 0, err
        rows = read_csv(tmp_path / name / "extrapolation.csv")
        losses.append([(r["eval_len"], r["finetune_steps"], r["loss"]) for r in rows])
    assert len(losses[0]) == 2 * 3 and losses[1] == losses[0]  # 2 seeds x (1x, 2x, 2x tuned)


@pytest.mark.parametrize("overrides, message", [
    (["routine.eval_lens=[1x,0]"], r"evaluation length of 0; it must be at least 1"),
    (["routine.eval_lens=[0x]"], r"'0x' gives an evaluation length of 0"),
    (["routine.eval_lens=[two]"], r"'two' is not a length"),
    (["routine.pes=[alibi,t5]", "routine.scalings=[yarn]"],
     r"routine.scalings=\['yarn'\] applies to RoPE only.*alibi"),
    (["routine.scalings=[linear:0]"], r"factor=0 is not valid; the scaling factor must be > 0"),
    (["routine.scalings=[linear:-1.5]"], r"factor=-1.5"),
    (["routine.scalings=[xpos]"], r"'xpos' is not a RoPE scaling; valid: none, linear"),
    (["routine.pes=[rope,rotary]"], r"unknown pe 'rotary'; valid: alibi, learned"),
    (["task=lm", "routine.train_len=16", "routine.eval_lens=[1x,100000]"],
     r"evaluation length 100000 \(100000 tokens\) cannot be generated: .*held-out text"),
    (["routine.seeds=0"], r"routine.seeds=0"),
    (["routine.finetune_steps=-1"], r"routine.finetune_steps=-1"),
])
def test_bad_input_exits_2_before_writing(tlab, tmp_path: Path, overrides, message) -> None:
    out = tmp_path / "run"
    code, _, err = tlab("experiment=extrapolate", *TINY, *overrides, f"hydra.run.dir={out}")
    assert code == 2
    assert len(err.strip().splitlines()) <= 2 and "Traceback" not in err
    assert re.search(message, " ".join(err.split())), err
    assert not out.exists()  # nothing written


def test_cli_options_map_to_the_routine(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    result = CliRunner().invoke(app, ["extrapolate", "--pe", "alibi", "--scaling", "none,yarn:4",
                                      "--train-len", "3", "--out", str(tmp_path / "x")])
    text = result.output
    with contextlib.suppress(ValueError):  # older Click: stderr already mixed into output
        text += result.stderr
    assert result.exit_code == 2
    assert "routine.scalings=['yarn:4'] applies to RoPE only" in " ".join(text.split())
    spec = RunSpec.of(compose(["experiment=extrapolate", "routine.pes=" + hydra_list("none, rope"),
                               "routine.eval_lens=" + hydra_list("1x,24")]))
    assert make_plan(spec).pes == ["none", "rope"]
    assert make_plan(spec).eval_lens == [4, 24]  # train_len null: task.seq_len (4)
    six = RunSpec.of(compose(["experiment=extrapolate", "task.seq_len=6"]))
    assert make_plan(six).train_len == 6


def test_eval_task_matches_train_task_data_seed() -> None:
    """The same data_seed at another length: the held-out split stays disjoint from training."""
    spec = extrapolate_spec("arch=encoder", "task.data_seed=7")
    assert spec.task["seq_len"] != 6
    task = task_at(spec, 6, "test")
    assert task.seq_len == 6
    same_seed = ReverseTask(seq_len=6, vocab_size=10, causal=False, eval_size=16, data_seed=7)
    assert torch.equal(task.eval_batch().inputs, same_seed.eval_batch().inputs)
    held_out = task._is_held_out(task.eval_batch().inputs)
    assert held_out.all()
    train = task.train_batch(64, torch.Generator().manual_seed(0)).inputs
    assert not task._is_held_out(train).any()
