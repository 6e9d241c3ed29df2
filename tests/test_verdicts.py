"""Verdicts in every comparison with seeds (DESIGN.md "Additions" -> Verdicts): comparison.csv's
columns recomputed by hand with scipy.stats from compare_runs.csv, --baseline, validate step 4's
detail, reverse.csv against the NoPE control, extrapolation.csv against the baseline curve."""

from __future__ import annotations

import contextlib
import itertools
import math

import numpy as np
import pytest
from helpers import read_csv
from scipy import stats

from transformer_lab.routines.compare import (
    COMPARISON_COLUMNS,
    SeedRun,
    comparison_checks,
    comparison_rows,
)
from transformer_lab.routines.extrapolate import (
    EXTRAPOLATION_COLUMNS,
    baselines,
    with_verdicts,
)
from transformer_lab.routines.reverse_task import reverse_rows, verdict_line
from transformer_lab.training.trainer import TrainResult

FAST = ["model=tiny", "model.d_model=16", "task.seq_len=8", "task.eval_size=32",
        "train.batch_size=8"]
# The columns comparison.csv had before the verdicts: they keep their names and order.
OLD_COLUMNS = ["activation", "params", "ffn_params", "tokens_per_s", "rel_speed", "final_loss",
               "final_ppl", "grad_norm_mean", "grad_norm_std", "steps_to_target", "seeds",
               "loss_target", "final_loss_std", "first_loss", "steps"]
ALPHA = 0.05
TOL = 1e-5  # comparison.csv keeps 6 significant digits (compare_runs.csv's final_loss: all)


def sign_flip_p(differences: np.ndarray) -> float:
    """Two-sided p of the paired sign-flip test, by enumerating all 2^n sign patterns."""
    observed = abs(differences.mean())
    means = [abs((differences * signs).mean())
             for signs in itertools.product((1.0, -1.0), repeat=len(differences))]
    return min(1.0, sum(m >= observed - 1e-12 for m in means) / len(means))


def holm_by_hand(p: dict[str, float]) -> dict[str, float]:
    order = sorted(p, key=p.get)
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p[name]))
        adjusted[name] = running
    return adjusted


def seeds_for_power(diff: float, sd: float, comparisons: int) -> int:
    """Smallest n with 80% power of the paired t-test at alpha / comparisons (noncentral t)
    that the sign-flip test can also reach (2 / 2^n <= level)."""
    level = ALPHA / comparisons
    n = max(2, math.ceil(math.log2(2 / level)))
    while True:
        df, nc = n - 1, abs(diff / sd) * math.sqrt(n)
        critical = stats.t.ppf(1 - level / 2, df)
        if stats.nct.sf(critical, df, nc) + stats.nct.cdf(-critical, df, nc) >= 0.8:
            return n
        n += 1


def test_comparison_statistics_agree_with_scipy_by_hand(tlab, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = tlab("experiment=compare_activations",
                             "routine.activations=[relu,gelu,swish]", "routine.baseline=gelu",
                             "routine.steps=15", "routine.seeds=7", *FAST,
                             f"hydra.run.dir={out}")
    assert code == 0, err
    rows = {r["activation"]: r for r in read_csv(out / "comparison.csv")}
    header = list(next(iter(rows.values())))
    # the row's name first (variant, the varied KEY), then the old columns in their order
    assert header[:2] == ["variant", "varied"] and header == COMPARISON_COLUMNS
    assert header[2:len(OLD_COLUMNS) + 2] == OLD_COLUMNS
    assert header[len(OLD_COLUMNS) + 2:] == [
        "final_loss_ci_low", "final_loss_ci_high", "diff_vs_baseline", "diff_ci_low",
        "diff_ci_high", "p_value", "p_adjusted", "verdict", "p_improvement", "p_improvement_low",
        "p_improvement_high", "seeds_needed", "paired_seeds", "note",
        "early_loss", "late_loss_std",  # the curve metrics came after the verdict columns
        "params_vs_baseline", "params_note",  # then tlab compare's
        "seeds_used", "stopped_because", "e_value",  # and --seeds auto's
        "sequential_design"]  # and the group-sequential design's
    per_seed = read_csv(out / "compare_runs.csv")
    assert len(per_seed) == 21  # one row per (activation, seed)
    loss = {(r["activation"], int(r["seed"])): float(r["final_loss"]) for r in per_seed}
    seeds = list(range(7))
    x = {a: np.array([loss[(a, s)] for s in seeds]) for a in rows}  # (seeds,) paired by seed
    p_values = {}
    for name, row in rows.items():
        low, high = stats.t.interval(0.95, 6, loc=x[name].mean(), scale=stats.sem(x[name]))
        assert float(row["final_loss_ci_low"]) == pytest.approx(low, abs=TOL)
        assert float(row["final_loss_ci_high"]) == pytest.approx(high, abs=TOL)
        assert float(row["final_loss"]) == pytest.approx(x[name].mean(), abs=TOL)
        if name == "gelu":
            assert row["verdict"] == "baseline" and row["p_value"] == row["diff_vs_baseline"] == ""
            continue
        d = x[name] - x["gelu"]
        interval = stats.ttest_rel(x[name], x["gelu"]).confidence_interval(0.95)
        assert float(row["diff_vs_baseline"]) == pytest.approx(d.mean(), abs=TOL)
        assert float(row["diff_ci_low"]) == pytest.approx(interval.low, abs=TOL)
        assert float(row["diff_ci_high"]) == pytest.approx(interval.high, abs=TOL)
        p_values[name] = sign_flip_p(d)
        paired = stats.permutation_test((x[name], x["gelu"]), lambda a, b: np.mean(a - b),
                                        permutation_type="samples", n_resamples=math.inf)
        assert p_values[name] == pytest.approx(paired.pvalue)  # scipy's own paired test agrees
        assert float(row["p_value"]) == pytest.approx(p_values[name])
        assert row["paired_seeds"] == "7" and row["note"] == ""
        wins = [0.5 if a == b else float(a < b) for i, a in enumerate(x[name])
                for j, b in enumerate(x["gelu"]) if i != j]  # seeds i != j, lower is better
        assert float(row["p_improvement"]) == pytest.approx(sum(wins) / len(wins))
        assert float(row["p_improvement_low"]) <= float(row["p_improvement"]) \
            <= float(row["p_improvement_high"])
        needed = seeds_for_power(d.mean(), d.std(ddof=1), comparisons=2)
        assert int(row["seeds_needed"]) == needed
    for name, adjusted in holm_by_hand(p_values).items():
        row = rows[name]
        assert float(row["p_adjusted"]) == pytest.approx(adjusted)
        diff = float(row["diff_vs_baseline"])
        expected = ("no detectable difference" if adjusted > ALPHA
                    else "better" if diff < 0 else "worse")
        assert row["verdict"] == expected
        assert f"{name} vs gelu: final_loss" in stdout and f"-> {expected}" in stdout


def test_unknown_baseline_exits_2_naming_the_compared_ones(tmp_path):
    from typer.testing import CliRunner

    from transformer_lab.cli import app

    out = tmp_path / "x"
    result = CliRunner().invoke(app, ["compare-activations", "--activations", "relu,gelu",
                                      "--baseline", "swish", "--out", str(out)])
    text = result.output
    with contextlib.suppress(ValueError):  # older Click: stderr already mixed into output
        text += result.stderr
    assert result.exit_code == 2
    assert "--baseline swish" in text and "valid: relu, gelu" in " ".join(text.split())
    assert "Traceback" not in text and not out.exists()


def seed_run(activation: str, seed: int, final: float) -> SeedRun:
    result = TrainResult(steps=10, final_loss=final, wall_s=1.0, tokens_per_s=1000.0,
                         train_losses=[3.0, 2.0, final], grad_norms=[1.0, 1.1, 0.9])
    return SeedRun(activation, seed, result, 100, {"activation": activation, "gated_ffn": False},
                   [0, 5, 10], {"ffn": 40})


def test_validate_step_4_detail_gives_the_verdict():
    """validate step 4 reuses comparison_rows/comparison_checks: the detail ends with it."""
    runs = [seed_run("relu", s, 1.5 + 0.01 * s) for s in range(8)]
    runs += [seed_run("gelu", s, 1.3 + 0.01 * s + 0.001 * (s % 3)) for s in range(8)]
    rows = comparison_rows(runs, None)
    assert [r["verdict"] for r in rows] == ["baseline", "better"]
    assert rows[1]["p_value"] == pytest.approx(2 / 2 ** 8)  # every seed: gelu lower
    relu, gelu = comparison_checks(rows)
    assert "vs" not in relu.detail
    assert "gelu vs relu: final_loss 0.199 lower" in gelu.detail and "-> better" in gelu.detail
    flipped = comparison_rows(runs, None, baseline="gelu")
    assert [r["verdict"] for r in flipped] == ["worse", "baseline"]


def reversal(role: str, pe: str, seed: int, exact: float) -> SeedRun:
    result = TrainResult(steps=50, final_loss=1.0, best_exact_match=exact,
                         solved_step=50 if exact >= 0.99 else None)
    tags = {"pe": pe, "arch": "encoder", "target": 0.99, "expected": "solves"}
    return SeedRun(role, seed, result, 1000, tags)


def test_reverse_rows_test_the_pe_against_its_control_on_exact_match():
    chosen = [0.99, 1.0, 0.97, 1.0, 0.995, 0.98]
    control = [0.06, 0.08, 0.07, 0.05, 0.07, 0.09]
    runs = [r for s in range(6) for r in (reversal("chosen", "rope", s, chosen[s]),
                                           reversal("nope_control", "none", s, control[s]))]
    rows = reverse_rows(runs)
    assert [r["seed"] for r in rows] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    pe_row, control_row = rows[0], rows[1]
    d = np.array(chosen) - np.array(control)
    assert pe_row["diff_vs_baseline"] == pytest.approx(d.mean())
    low, high = stats.ttest_rel(chosen, control).confidence_interval(0.95)
    assert (pe_row["diff_ci_low"], pe_row["diff_ci_high"]) == pytest.approx((low, high))
    assert pe_row["p_value"] == pytest.approx(2 / 2 ** 6) and pe_row["verdict"] == "better"
    low, high = stats.t.interval(0.95, 5, loc=np.mean(control), scale=stats.sem(control))
    assert (control_row["best_exact_match_ci_low"],
            control_row["best_exact_match_ci_high"]) == pytest.approx((low, high))
    assert control_row["verdict"] == "baseline"
    assert verdict_line(rows).startswith("pe=rope vs pe=none: held-out exact match 0.9")
    assert verdict_line(rows).endswith("-> better")
    # Higher exact match is better: a PE below its control is "worse".
    swapped = reverse_rows([reversal(r.variant, r.tags["pe"], r.seed,
                                     1.0 - r.result.best_exact_match) for r in runs])
    assert swapped[0]["verdict"] == "worse"
    alone = reverse_rows([reversal("chosen", "none", 0, 0.1)])  # no control: nothing to test
    assert "verdict" not in alone[0] and verdict_line(alone) is None


def extrapolation_row(pe: str, scaling: str, seed: int, length: int, loss: float | None,
                      finetune: int = 0) -> dict:
    status = "ok" if loss is not None else "error"
    return {"pe": pe, "scaling": scaling, "seed": seed, "eval_len": length,
            "finetune_steps": finetune, "status": status,
            "loss": math.nan if loss is None else loss}


def test_extrapolation_curves_are_tested_against_their_baseline():
    rng = np.random.default_rng(0)
    rows = []
    for seed in range(7):  # 2 tests against rope at 8 tokens: 7 seeds for Holm's room
        noise = rng.normal(0, 0.01, 4)
        for length in (4, 8):
            rows += [extrapolation_row("rope", "none", seed, length, 2.0 + noise[0]),
                     extrapolation_row("rope", "yarn", seed, length, 1.5 + noise[1]),
                     extrapolation_row("alibi", "none", seed, length, 2.0 + noise[2]),
                     extrapolation_row("learned", "none", seed, length,
                                       None if length == 8 else 2.5 + noise[3])]
    rows.append(extrapolation_row("rope", "none", 0, 8, 1.0, finetune=5))
    assert baselines(rows) == {"rope": "rope", "rope+yarn": "rope", "alibi": "rope",
                               "learned": "rope", "rope ft5": "rope"}
    assert baselines([r for r in rows if r["scaling"] == "yarn"]) == {"rope+yarn": "rope+yarn"}
    out = with_verdicts(rows)
    by_key = {(r["pe"], r["scaling"], r["eval_len"], r["finetune_steps"]): r for r in out}
    assert by_key[("rope", "none", 4, 0)]["verdict"] == "baseline"
    yarn = by_key[("rope", "yarn", 8, 0)]
    x = np.array([r["loss"] for r in rows if r["scaling"] == "yarn" and r["eval_len"] == 8])
    y = np.array([r["loss"] for r in rows if (r["pe"], r["scaling"], r["eval_len"],
                                               r["finetune_steps"]) == ("rope", "none", 8, 0)])
    assert yarn["diff_vs_baseline"] == pytest.approx((x - y).mean())
    assert yarn["p_value"] == pytest.approx(sign_flip_p(x - y))
    assert yarn["verdict"] == "better" and yarn["baseline"] == "rope"
    low, high = stats.t.interval(0.95, 6, loc=x.mean(), scale=stats.sem(x))
    assert (yarn["loss_ci_low"], yarn["loss_ci_high"]) == pytest.approx((low, high))
    assert by_key[("alibi", "none", 8, 0)]["verdict"] == "no detectable difference"
    learned = by_key[("learned", "none", 8, 0)]  # every seed an error row: nothing to pair
    assert learned["paired_seeds"] == 0 and "7 seeds dropped" in learned["note"]
    assert by_key[("rope", "none", 8, 5)]["paired_seeds"] == 1  # only seed 0 fine-tuned


def test_extrapolate_rewrites_its_csv_with_the_verdicts(tlab, tmp_path):
    out = tmp_path / "run"
    code, stdout, err = tlab(
        "experiment=extrapolate", "model=tiny", "train.steps=8", "train.lr=2e-2",
        "task.eval_size=16", "routine.train_len=3", "train.log_every=4",
        "routine.pes=[rope,alibi]", "routine.eval_lens=[1x,2x]", "routine.seeds=2",
        f"hydra.run.dir={out}")
    assert code == 0, err
    rows = read_csv(out / "extrapolation.csv")
    assert list(rows[0]) == EXTRAPOLATION_COLUMNS and len(rows) == 8
    for row in rows:
        losses = [float(r["loss"]) for r in rows
                  if (r["pe"], r["eval_len"]) == (row["pe"], row["eval_len"])]
        assert row["baseline"] == "rope"
        assert float(row["loss_ci_low"]) <= np.mean(losses) <= float(row["loss_ci_high"])
        expected = "baseline" if row["pe"] == "rope" else "no detectable difference"
        assert row["verdict"] == expected  # 2 seeds: the smallest p is 0.5
        assert row["paired_seeds"] == ("" if row["pe"] == "rope" else "2")
    assert "at 6 tokens: alibi vs rope: loss" in " ".join(stdout.split())
