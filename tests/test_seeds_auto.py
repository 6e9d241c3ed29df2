"""``--seeds auto[:MAX]`` on tlab compare: seeds two at a time until the sequential test
(``anytime:MAX`` and ``auto``: the anytime-valid ``measures.sequential``; ``auto:MAX``: the
group-sequential ``measures.group_sequential``) gives every variant a verdict, only undecided
variants train more, and ``comparison.csv``'s verdict, interval and statistic are the test's on
the seeds trained."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers import read_csv
from typer.testing import CliRunner

from transformer_lab.cli import app
from transformer_lab.config.spec import RoutineSettings
from transformer_lab.measures.group_sequential import GroupSequentialTest
from transformer_lab.measures.sequential import SequentialTest
from transformer_lab.routines.study import SeedRun, Study, run_study, study
from transformer_lab.training.trainer import TrainResult

# The tiny model on the offline synthetic language: a fraction of a second per (variant, seed).
# train.lr=3e-4 learns slowly in 15 steps, 1e-2 fast; 3.3e-4 is nearly the first one.
FAST = ["task=lm", "model=tiny", "task.eval_size=32", "train.batch_size=8", "--steps", "15"]


def compare(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["compare", *args])
    return result.exit_code, result.output


def test_auto_stops_a_clear_effect_early_and_keeps_testing_the_rest(tmp_path):
    out = tmp_path / "auto"
    code, output = compare("--vary", "train.lr=3e-4,1e-2,3.3e-4", "--seeds", "anytime:16",
                           *FAST, "--out", str(out))
    assert code == 0, output
    rows = {r["variant"]: r for r in read_csv(out / "comparison.csv")}
    clear, twin, base = rows["0.01"], rows["0.00033"], rows["0.0003"]
    assert clear["verdict"] == "better" and clear["stopped_because"] == "verdict"
    assert twin["stopped_because"] in ("max_seeds", "verdict")
    used = int(clear["seeds_used"])
    assert 2 <= used < 16 and used % 2 == 0
    assert int(base["seeds_used"]) == max(used, int(twin["seeds_used"]))
    # the decided variant trained no seed after its verdict; the baseline paired every group
    runs = read_csv(out / "compare_runs.csv")
    seeds = {name: sorted(int(r["seed"]) for r in runs if r["variant"] == name) for name in rows}
    assert seeds["0.01"] == list(range(used))
    assert seeds["0.0003"] == list(range(int(base["seeds_used"])))
    # the verdict is the sequential test's on exactly those losses, group by group (no fixed test)
    loss = {(r["variant"], int(r["seed"])): float(r["final_loss"]) for r in runs}
    test = SequentialTest(["0.0003", "0.01", "0.00033"], "0.0003", alpha=0.05, max_seeds=16)
    for first in range(0, int(base["seeds_used"]), 2):
        group = {name: [loss[name, s] for s in (first, first + 1) if (name, s) in loss]
                 for name in rows}
        test.update_values({name: values for name, values in group.items() if values})
    assert test.verdict("0.01") == "better" and test.seeds_used("0.01") == used
    assert float(clear["e_value"]) == pytest.approx(test.e_value("0.01"), rel=1e-5)
    assert float(clear["e_value"]) >= 2 / 0.05  # e-value Bonferroni over the 2 variants
    low, high = test.interval("0.01")
    assert float(clear["diff_ci_low"]) == pytest.approx(low, rel=1e-5)
    assert high < 0 and float(clear["diff_ci_high"]) == pytest.approx(high, rel=1e-5)
    assert float(clear["p_adjusted"]) == pytest.approx(min(1, 2 / test.e_value("0.01")),
                                                       rel=1e-5)
    assert "seeds auto" in output and "e-value" in output and "-> better" in " ".join(
        output.split())


def test_auto_max_is_the_group_sequential_design_on_the_seeds_trained(tmp_path):
    out = tmp_path / "group"
    code, output = compare("--vary", "train.lr=3e-4,1e-2,3.3e-4", "--seeds", "auto:16", *FAST,
                           "--out", str(out))
    assert code == 0, output
    rows = {r["variant"]: r for r in read_csv(out / "comparison.csv")}
    clear = rows["0.01"]
    assert clear["sequential_design"] == "group-sequential" and clear["e_value"] == ""
    assert clear["verdict"] == "better" and clear["stopped_because"] == "verdict"
    runs = read_csv(out / "compare_runs.csv")
    loss = {(r["variant"], int(r["seed"])): float(r["final_loss"]) for r in runs}
    test = GroupSequentialTest(["0.0003", "0.01", "0.00033"], "0.0003", max_seeds=16)
    for seed in range(int(rows["0.0003"]["seeds_used"])):  # a look after every seed
        test.update_values({name: [loss[name, seed]] for name in rows if (name, seed) in loss})
    assert test.verdict("0.01") == "better"
    assert int(clear["seeds_used"]) == test.seeds_used("0.01") < 16
    assert float(clear["p_value"]) == pytest.approx(test.p_value("0.01"), rel=1e-5)
    assert float(clear["p_value"]) <= test.nominal_level("0.01")
    assert float(clear["diff_ci_high"]) == pytest.approx(test.interval("0.01")[1], rel=1e-5)
    assert "group-sequential" in output and "-> better" in " ".join(output.split())


def test_fixed_seeds_keep_the_fixed_test_and_say_so(tmp_path):
    out = tmp_path / "fixed"
    code, output = compare("--vary", "train.lr=3e-4,1e-2", "--seeds", "3", *FAST,
                           "--out", str(out))
    assert code == 0, output
    rows = read_csv(out / "comparison.csv")
    assert [(r["seeds_used"], r["stopped_because"], r["e_value"]) for r in rows] == \
        [("3", "fixed", "")] * 2
    assert rows[1]["paired_seeds"] == "3" and math.isfinite(float(rows[1]["p_value"]))


@pytest.mark.parametrize("value", ["auto:1", "auto:x", "0", "many", "auto16"])
def test_a_bad_seeds_value_is_refused_naming_it(tmp_path, value):
    code, output = compare("--vary", "train.lr=3e-4,1e-2", "--seeds", value, *FAST,
                           "--out", str(tmp_path / "bad"))
    flat = " ".join(output.split())
    assert code == 2 and f"--seeds {value} (routine.seeds={value}):" in flat, output
    assert "auto[:MAX]" in flat
    assert not (tmp_path / "bad").exists()


def test_validate_step_4_takes_seeds_auto(tlab, tmp_path):
    out = tmp_path / "validate"
    code, stdout, err = tlab("experiment=validate", "routine.compare.routine.seeds=auto:4",
                             "routine.compare.routine.steps=20", f"hydra.run.dir={out}")
    assert code in (0, 1), err  # a verdict of the routine, not a refusal
    rows = read_csv(out / "comparison.csv")
    gelu = next(r for r in rows if r["variant"] == "gelu")
    assert gelu["stopped_because"] in ("verdict", "max_seeds")
    assert gelu["sequential_design"] == "group-sequential"
    used = int(gelu["seeds_used"])
    assert used in (2, 4)
    runs = read_csv(out / "compare_runs.csv")
    assert sorted(int(r["seed"]) for r in runs if r["variant"] == "gelu") == list(range(used))


@pytest.mark.parametrize(("value", "count", "design"), [
    (3, 3, None), ("auto", 32, "anytime"), ("auto:16", 16, "group"), ("anytime:4", 4, "anytime")])
def test_the_study_spec_reads_the_seed_plan(spec_for, value, count, design):
    spec, _ = spec_for("seed=5")
    routine = RoutineSettings("compare", {"seeds": value, "baseline": 0.01,
                                          "vary": {"key": "train.lr", "values": [0.003, 0.01]}})
    planned = study(replace(spec, routine=routine))
    assert planned.seeds == tuple(range(5, 5 + count)) and planned.design == design
    assert (planned.names, planned.baseline) == (["0.003", "0.01"], "0.01")


def test_run_study_trains_every_seed_or_stops_at_the_verdict():
    """Fixed seeds: each variant over all of them in order; auto: two seeds at a time for the
    baseline and the undecided variants, until the anytime test decides (b is always lower)."""
    calls, bars = [], []

    def train_one(name: str, seed: int) -> SeedRun:
        calls.append((name, seed))
        return SeedRun(name, seed, TrainResult(final_loss={"a": 2.0, "b": 1.0}[name]), 1)

    def bar(name: str, seeds: list[int]) -> tuple[str, int]:
        bars.append((name, seeds))
        return name, len(seeds)

    fixed = Study("k", ("a", "b"), "--vary k", None, (0, 1, 2))
    runs, test = run_study(fixed, train_one, None, bar)
    assert test is None and calls == [(n, s) for n in "ab" for s in (0, 1, 2)]
    assert bars == [("a", [0, 1, 2]), ("b", [0, 1, 2])] and [r.seed for r in runs] == [0, 1, 2] * 2
    calls.clear()
    auto = Study("k", ("a", "b"), "--vary k", None, tuple(range(32)), design="anytime")
    runs, test = run_study(auto, train_one, None, bar)
    used = test.seeds_used("b")
    assert test.verdict("b") == "better" and 2 <= used < 32 and used % 2 == 0
    assert calls == [(n, s) for g in range(0, used, 2) for n in "ab" for s in (g, g + 1)]
