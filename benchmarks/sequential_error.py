"""What ``--seeds auto`` costs and keeps: the anytime-valid test of
``transformer_lab.measures.sequential`` against the fixed sign-flip test of
``measures.statistics``, on paired differences resampled from the committed studies.

    python -m benchmarks.sequential_error                   # 1000 runs per family, minutes
    python -m benchmarks.sequential_error --sims 200 --group 2 --max 32 --alpha 0.05

The families: every study of ``experiments/`` with one row per (variant, seed) and a
``final_loss`` (``STUDIES``), each variant paired by seed with the study's baseline within a
stratum (a norm placement, a PE): the differences ``d = variant - baseline``, a
(source seeds, K variants) table per family. A simulated run draws ``--max`` seeds (rows of
that table, with replacement: the variants of one seed stay together, as they share its
baseline) and reads them ``--group`` at a time:

- null: each variant's differences centred to mean 0 (``null``), and also centred then
  multiplied by a random sign per seed (``null_symmetric``: exactly the tests' H0, the
  differences symmetric about 0; centring alone keeps the skew of 8-12 source seeds);
- alternatives: the differences as they are (a variant's true direction: the sign of its
  source mean).

Per family (and pooled over the families, each counted once per simulated run):

- ``fpr_auto``: runs in which ``SequentialTest`` declared any variant (e-value Bonferroni at
  K / alpha) under the null, with its Clopper-Pearson 95% interval;
- ``fpr_peeking``: the same for naive peeking: the fixed test (sign-flip p-values, Holm over
  the K variants, a verdict at p_adjusted <= alpha) re-run after every group, stopping at the
  first verdict; ``fpr_fixed``: the fixed test once at ``--max`` seeds (its nominal rate);
- ``power_auto``: the share of (run, variant) with a verdict in the variant's true direction
  under the alternatives (``wrong_auto``: in the other direction); ``mean_seeds_auto``: the
  seeds a run trained, stopping when every variant had a verdict or at ``--max`` (all
  variants train every seed); ``mean_seeds_variant``: per variant, seeds until its verdict;
- ``fixed_seeds``: the fewest seeds (a multiple of ``--group``) at which the fixed test's
  power (verdicts in the true direction) reaches ``power_auto``: the fixed design of equal
  power; empty when even ``--max`` seeds do not.

``benchmarks/sequential_error.csv`` gets one row per family and an ``all`` row; the last line
printed is ``false_positive_rate=<x> naive_peeking_rate=<y> mean_seeds_auto=<m>
fixed_seeds=<n>`` from the ``all`` row (the ``null``: centred differences).

The fixed test's p-values come from ``sign_flip_p_values``: the p-value of
``statistics.sign_flip_p_value`` for a batch of sequences (all 2^n sign flips up to 16 seeds,
identical to it; a Monte Carlo of ``--resamples`` flips beyond, where it uses 99,999).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.common import write_csv
from transformer_lab.measures.group_sequential import (
    DEFAULT_SPENDING,
    increments,
    sign_draws,
    sign_flip_boundaries,
)
from transformer_lab.measures.sequential import e_process, first_crossing
from transformer_lab.measures.statistics import EXACT_UP_TO, holm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "sequential_error.csv"
PLANNED_OUT = ROOT / "benchmarks" / "group_sequential.csv"
SPEND = DEFAULT_SPENDING  # the spending function of --seeds auto:MAX


@dataclass(frozen=True)
class Study:
    """A committed study's runs table: ``variant`` column, ``baseline`` value, the columns
    whose values make separate comparisons (``strata``) and the rows kept (``where``)."""

    name: str
    path: str
    variant: str
    baseline: str
    strata: tuple[str, ...] = ()
    where: dict[str, str] = field(default_factory=dict)


STUDIES = [
    Study("activations", "experiments/activations_runs.csv", "activation", "relu"),
    Study("moe", "experiments/moe_runs.csv", "activation", "gelu"),
    Study("norm_layers", "experiments/norm_layers_runs.csv", "norm_layer", "layernorm",
          strata=("block",)),
    Study("embed_scale", "experiments/embedding_scale_runs.csv", "model.embed_scale", "sqrt",
          strata=("pe",), where={"model.pe_scale": "1.0"}),
    Study("pe_scale", "experiments/embedding_scale_runs.csv", "model.pe_scale", "1.0",
          where={"model.embed_scale": "sqrt", "pe": "sinusoidal"}),
]


@dataclass(frozen=True)
class Family:
    """Paired differences of K variants against one baseline: (source seeds, K)."""

    name: str
    variants: list[str]
    differences: np.ndarray


def families(studies: list[Study] = STUDIES, root: Path = ROOT) -> list[Family]:
    """One ``Family`` per (study, stratum), variants paired with the baseline by seed."""
    found = []
    for study in studies:
        runs = pd.read_csv(root / study.path, dtype=str)
        for column, value in study.where.items():
            runs = runs[runs[column].astype(float if _is_number(value) else str)
                        == (float(value) if _is_number(value) else value)]
        groups = runs.groupby(list(study.strata)) if study.strata else [((), runs)]
        for stratum, rows in groups:
            stratum = stratum if isinstance(stratum, tuple) else (stratum,)
            wide = rows.pivot(index="seed", columns=study.variant, values="final_loss")
            wide = wide.astype(float).dropna()  # (seeds, variants)
            variants = [v for v in wide.columns if v != study.baseline]
            differences = wide[variants].to_numpy() - wide[[study.baseline]].to_numpy()
            label = "/".join([study.name, *map(str, stratum)])
            found.append(Family(label, variants, differences))
    return found


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# --- the fixed test, batched -------------------------------------------------------------

_SIGNS: dict[tuple[int, int], np.ndarray] = {}


def _sign_patterns(n: int, resamples: int) -> np.ndarray:
    """(patterns, n) of +/-1: all 2^n up to ``EXACT_UP_TO`` seeds, else ``resamples`` random
    ones (drawn once per n from a fixed seed, independent of every data set)."""
    key = (n, 0 if n <= EXACT_UP_TO else resamples)
    if key not in _SIGNS:
        if n <= EXACT_UP_TO:
            bits = (np.arange(2 ** n)[:, None] >> np.arange(n)) & 1
            _SIGNS[key] = 1.0 - 2.0 * bits
        else:
            _SIGNS[key] = np.random.default_rng(n).choice([-1.0, 1.0], size=(resamples, n))
    return _SIGNS[key]


def sign_flip_p_values(differences: np.ndarray, resamples: int = 4_999,
                       chunk: int = 64) -> np.ndarray:
    """Two-sided sign-flip p-values of ``mean(d) = 0`` for each row of ``differences``
    (batch, n) -> (batch,): ``statistics.sign_flip_p_value``'s test (scipy's
    ``permutation_test`` rule: twice the smaller tail, ties within 1e-14 relative counted,
    capped at 1; exact up to ``EXACT_UP_TO`` seeds, else ``(count + 1) / (resamples + 1)``)."""
    differences = np.asarray(differences, dtype=float)
    n = differences.shape[-1]
    signs = _sign_patterns(n, resamples)  # (patterns, n)
    exact = n <= EXACT_UP_TO
    p_values = np.empty(len(differences))
    for start in range(0, len(differences), chunk):
        block = differences[start:start + chunk]  # (chunk, n)
        observed = block.mean(axis=-1, keepdims=True)  # (chunk, 1)
        null = block @ signs.T / n  # (chunk, patterns)
        gamma = np.abs(1e-14 * observed)
        less = (null <= observed + gamma).sum(axis=-1)
        greater = (null >= observed - gamma).sum(axis=-1)
        adjustment = 0 if exact else 1
        tails = (np.minimum(less, greater) + adjustment) / (len(signs) + adjustment)
        p_values[start:start + chunk] = np.minimum(1.0, 2 * tails)
    return p_values


def fixed_test_verdicts(differences: np.ndarray, looks: list[int], alpha: float,
                        resamples: int) -> np.ndarray:
    """The fixed test at each look: (runs, K, n) -> (runs, K, looks) of -1 / 0 / +1 (a
    verdict lower / none / higher; Holm over the K variants, p_adjusted <= alpha)."""
    runs, k, _ = differences.shape
    out = np.zeros((runs, k, len(looks)), dtype=int)
    for index, n in enumerate(looks):
        head = differences[..., :n]  # (runs, K, n)
        p = sign_flip_p_values(head.reshape(runs * k, n), resamples).reshape(runs, k)
        adjusted = np.apply_along_axis(holm, 1, p)  # (runs, K)
        out[..., index] = np.where(adjusted <= alpha, np.sign(head.mean(axis=-1)), 0)
    return out


# --- one family ------------------------------------------------------------------------------

@dataclass
class Outcome:
    """Counts over simulated runs of one family (pooled by adding)."""

    runs: int = 0
    variant_runs: int = 0
    fp_auto: int = 0
    fp_auto_symmetric: int = 0
    fp_peeking: int = 0
    fp_peeking_symmetric: int = 0
    fp_fixed: int = 0
    right_auto: int = 0
    wrong_auto: int = 0
    seeds_auto: int = 0
    seeds_variant: int = 0
    fp_group: int = 0
    fp_group_symmetric: int = 0
    right_group: int = 0
    wrong_group: int = 0
    seeds_group: int = 0
    seeds_group_variant: int = 0
    right_fixed: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))
    fp_fixed_looks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=int))

    def add(self, other: Outcome) -> Outcome:
        arrays = ("right_fixed", "fp_fixed_looks")  # (looks,) counts
        merged = Outcome(**{name: getattr(self, name) + getattr(other, name)
                            for name in self.__dataclass_fields__ if name not in arrays})
        for name in arrays:
            mine, theirs = getattr(self, name), getattr(other, name)
            setattr(merged, name, theirs if not len(mine) else mine + theirs)
        return merged


def auto_decisions(differences: np.ndarray, looks: list[int],
                   alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """``SequentialTest``'s rule on (runs, K, n): (the look index of each variant's verdict,
    -1 for none; its direction, +1 higher / -1 lower), each (runs, K)."""
    k = differences.shape[1]
    up, down = e_process(differences, looks)  # (runs, K, looks) each
    crossing = first_crossing((up + down) / 2, k / alpha)
    at = np.maximum(crossing, 0)[..., None]
    higher = np.take_along_axis(up, at, -1)[..., 0] >= np.take_along_axis(down, at, -1)[..., 0]
    return crossing, np.where(higher, 1, -1)


def group_decisions(differences: np.ndarray, looks: list[int], most: int, alpha: float,
                    draws: int = 2_000, chunk: int = 64, spend: str = SPEND
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``GroupSequentialTest``'s rule (O'Brien-Fleming spending, Bonferroni, sign-flip
    boundaries from ``draws`` null sign vectors) on (runs, K, n): (the look index of each
    variant's verdict, -1 for none; its direction, +1 higher / -1 lower), each (runs, K)."""
    runs, k, _ = differences.shape
    spent = increments(looks, most, alpha / k, spend)
    signs = sign_draws(most, draws)
    flat = differences.reshape(runs * k, -1)
    sums = np.round(np.stack([flat[:, :n].sum(axis=-1) for n in looks], axis=-1), 12)
    crossing = np.full(runs * k, -1)
    for start in range(0, runs * k, chunk):
        bounds, _ = sign_flip_boundaries(np.abs(flat[start:start + chunk]), looks, spent, signs)
        crossed = np.abs(sums[start:start + chunk]) >= bounds  # (chunk, looks)
        crossing[start:start + chunk] = np.where(crossed.any(axis=-1), crossed.argmax(axis=-1),
                                                 -1)
    at = np.maximum(crossing, 0)[:, None]
    direction = np.where(np.take_along_axis(sums, at, -1)[:, 0] > 0, 1, -1)
    return crossing.reshape(runs, k), direction.reshape(runs, k)


def simulate(family: Family, sims: int, group: int, most: int, alpha: float, resamples: int,
             rng: np.random.Generator) -> Outcome:
    """``sims`` runs of ``most`` seeds drawn from the family (see the module docstring)."""
    looks = list(range(group, most + 1, group))
    source = family.differences  # (seeds, K)
    k = source.shape[1]
    draws = rng.integers(0, len(source), size=(sims, most))
    centred = (source - source.mean(axis=0))[draws].transpose(0, 2, 1)  # (sims, K, most)
    flips = rng.choice([-1.0, 1.0], size=(sims, 1, most))
    alternative = source[draws].transpose(0, 2, 1)
    truth = np.sign(source.mean(axis=0))[None, :]  # (1, K)
    outcome = Outcome(runs=sims, variant_runs=sims * k)
    for null, name in ((centred, "fp_auto"), (centred * flips, "fp_auto_symmetric")):
        crossing, _ = auto_decisions(null, looks, alpha)
        setattr(outcome, name, int((crossing >= 0).any(axis=1).sum()))
    for null, name in ((centred, "fp_peeking"), (centred * flips, "fp_peeking_symmetric")):
        verdicts = fixed_test_verdicts(null, looks, alpha, resamples)  # (sims, K, looks)
        setattr(outcome, name, int((verdicts != 0).any(axis=(1, 2)).sum()))
        if name == "fp_peeking":
            outcome.fp_fixed = int((verdicts[..., -1] != 0).any(axis=1).sum())
            outcome.fp_fixed_looks = (verdicts != 0).any(axis=1).sum(axis=0)  # (looks,)
    every_seed = list(range(1, most + 1))  # auto:MAX looks after every seed
    for null, name in ((centred, "fp_group"), (centred * flips, "fp_group_symmetric")):
        crossing, _ = group_decisions(null, every_seed, most, alpha)
        setattr(outcome, name, int((crossing >= 0).any(axis=1).sum()))
    crossing, direction = group_decisions(alternative, every_seed, most, alpha)
    decided = crossing >= 0
    outcome.right_group = int((decided & (direction == truth)).sum())
    outcome.wrong_group = int((decided & (direction != truth)).sum())
    seeds = np.where(decided, crossing + 1, most)  # (sims, K)
    outcome.seeds_group_variant = int(seeds.sum())
    outcome.seeds_group = int(np.where(decided.all(axis=1), seeds.max(axis=1), most).sum())
    crossing, direction = auto_decisions(alternative, looks, alpha)
    decided = crossing >= 0
    outcome.right_auto = int((decided & (direction == truth)).sum())
    outcome.wrong_auto = int((decided & (direction != truth)).sum())
    seeds = np.where(decided, (crossing + 1) * group, most)  # (sims, K)
    outcome.seeds_variant = int(seeds.sum())
    outcome.seeds_auto = int(np.where(decided.all(axis=1), seeds.max(axis=1), most).sum())
    verdicts = fixed_test_verdicts(alternative, looks, alpha, resamples)
    outcome.right_fixed = (verdicts == truth[..., None]).sum(axis=(0, 1))  # (looks,)
    return outcome


# --- the group-sequential design at a planned effect -------------------------------------------

def t_design_decisions(differences: np.ndarray, most: int, alpha: float, spend: str,
                       rng: np.random.Generator, null_runs: int = 100_000
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The same spending on the paired t statistic instead of the sign-flip sum (boundaries
    from ``null_runs`` normal null runs, looks from 3 seeds): a parametric group-sequential
    t-test, measured beside the sign-flip design. (runs, most) -> (look index of the verdict,
    -1 for none; direction), each (runs,)."""
    def t_statistics(x: np.ndarray) -> np.ndarray:  # (runs, most) -> (runs, most - 2)
        n = np.arange(1, x.shape[1] + 1)
        mean = np.cumsum(x, axis=1) / n
        var = (np.cumsum(x * x, axis=1) - n * mean ** 2) / np.maximum(n - 1, 1)
        return (mean / np.sqrt(np.maximum(var, 1e-300) / n))[:, 2:]

    null = np.abs(t_statistics(rng.normal(size=(null_runs, most))))
    spent = np.cumsum(increments(list(range(3, most + 1)), most, alpha, spend))
    bounds, active = [], np.ones(null_runs, dtype=bool)
    for k, level in enumerate(spent):
        allowed = math.floor(level * null_runs + 1e-9) - int((~active).sum())
        ordered = np.sort(null[active, k])[::-1]
        bounds.append(ordered[allowed - 1] if allowed >= 1 else np.inf)
        active &= null[:, k] < bounds[-1]
    t = t_statistics(differences)
    crossed = np.abs(t) >= np.asarray(bounds)
    crossing = np.where(crossed.any(axis=1), crossed.argmax(axis=1), -1)
    at = np.maximum(crossing, 0)[:, None]
    return crossing, np.where(np.take_along_axis(t, at, 1)[:, 0] > 0, 1, -1)


def sign_flip_design(d: np.ndarray, most: int, alpha: float, spend: str,
                     rng: np.random.Generator) -> tuple[float, float]:
    """``auto:MAX`` (a look after every seed) on one variant's runs d (runs, >= most): its
    power (verdicts above 0) and mean seeds. ``rng`` is unused (the boundaries' signs are
    fixed); it is there to match ``t_design``."""
    crossing, direction = group_decisions(d[:, None, :most], list(range(1, most + 1)), most,
                                          alpha, draws=4_096, spend=spend)
    seeds = np.where(crossing >= 0, crossing + 1, most)
    return float(((crossing >= 0) & (direction > 0)).mean()), float(seeds.mean())


def t_design(d: np.ndarray, most: int, alpha: float, spend: str,
             rng: np.random.Generator) -> tuple[float, float]:
    """The group-sequential t-test (``t_design_decisions``) on d (runs, >= most): its power
    and mean seeds."""
    crossing, direction = t_design_decisions(d[:, :most], most, alpha, spend, rng)
    seeds = np.where(crossing >= 0, crossing + 3, most)
    return float(((crossing >= 0) & (direction > 0)).mean()), float(seeds.mean())


def planned_rows(sims: int, alpha: float, rng: np.random.Generator,
                 fixed_sizes: tuple[int, ...] = (8, 12, 16, 24, 32),
                 powers: tuple[float, ...] = (0.8, 0.9), spend: str = SPEND) -> list[dict]:
    """Normal paired differences (sd 1) at the effect a fixed t-test of ``n`` seeds detects
    with the given power (one variant, two-sided ``alpha``). The group-sequential design looks
    after every seed, as ``--seeds auto:MAX`` does; MAX is planned as a designer would: of
    MAX in [n, 1.5 n], the one with the fewest mean seeds among those reaching the power. Per
    row: that MAX, its power, mean seeds and false-positive rate (normal null); the seeds the
    fixed sign-flip test (``--seeds N``'s) needs for the same power; and the parametric
    group-sequential t-test at the same spending (``t_design_decisions``) planned the same way.
    """
    from scipy.optimize import brentq

    rows = []
    for power in powers:
        for n in fixed_sizes:
            critical = stats.t.isf(alpha / 2, n - 1)
            effect = brentq(lambda e, n=n, c=critical, power=power: stats.nct.sf(
                c, n - 1, e * math.sqrt(n)) - power, 1e-3, 10.0)
            longest = math.ceil(1.5 * n)

            found = {}
            for name, design in (("group", sign_flip_design), ("t", t_design)):
                # MAX planned on one set of runs, its power and mean seeds measured on another
                planning = rng.normal(effect, 1.0, size=(sims, longest))
                outcomes = {most: design(planning, most, alpha, spend, rng)
                            for most in range(n, longest + 1)}
                reaching = [m for m, (right, _) in outcomes.items() if right >= power]
                if reaching:
                    most = min(reaching, key=lambda m: outcomes[m][1])
                    right, seeds = design(rng.normal(effect, 1.0, size=(sims, most)), most,
                                          alpha, spend, rng)
                    found.update({f"max_seeds_{name}": most, f"power_{name}": right,
                                  f"mean_seeds_{name}": seeds})
            if "max_seeds_group" in found:
                most = found["max_seeds_group"]
                null = rng.normal(0.0, 1.0, size=(sims, 1, most))
                found["fpr_group"] = float((group_decisions(
                    null, list(range(1, most + 1)), most, alpha, draws=4_096,
                    spend=spend)[0] >= 0).mean())
            sign_flip = None
            for m in range(n, 2 * n):
                diffs = rng.normal(effect, 1.0, size=(8_000, m))
                if (sign_flip_p_values(diffs) <= alpha).mean() >= power:
                    sign_flip = m
                    break
            row = dict(power=power, fixed_t_seeds=n, effect_sd=effect, spending=spend,
                       fixed_sign_flip_seeds=sign_flip, **found)
            if "mean_seeds_group" in found:
                row["ratio_vs_fixed_t"] = found["mean_seeds_group"] / n
                if sign_flip:
                    row["ratio_vs_fixed_sign_flip"] = found["mean_seeds_group"] / sign_flip
            if "mean_seeds_t" in found:
                row["ratio_t_design_vs_fixed_t"] = found["mean_seeds_t"] / n
            rows.append(row)
    return rows


# --- the table -------------------------------------------------------------------------------

def _rate_interval(count: int, total: int) -> tuple[float, float]:
    interval = stats.binomtest(count, total).proportion_ci(0.95, method="exact")
    return float(interval.low), float(interval.high)


def summary_row(name: str, variants: int, outcome: Outcome, group: int, most: int) -> dict:
    """One CSV row from the counts (rates over runs; power over (run, variant))."""
    runs, variant_runs = outcome.runs, outcome.variant_runs
    power_auto = outcome.right_auto / variant_runs
    power_fixed = outcome.right_fixed / variant_runs  # (looks,)
    reached = np.flatnonzero(power_fixed >= power_auto)
    fixed_seeds = int((reached[0] + 1) * group) if len(reached) else None
    power_group = outcome.right_group / variant_runs
    reached_group = np.flatnonzero(power_fixed >= power_group)
    fixed_seeds_group = int((reached_group[0] + 1) * group) if len(reached_group) else None
    row = {"family": name, "variants": variants, "runs": runs}
    for key in ("fp_auto", "fp_peeking"):
        low, high = _rate_interval(getattr(outcome, key), runs)
        label = key.replace("fp_", "fpr_")
        row.update({label: getattr(outcome, key) / runs, f"{label}_low": low,
                    f"{label}_high": high,
                    f"{label}_symmetric": getattr(outcome, f"{key}_symmetric") / runs})
    row.update(fpr_fixed=outcome.fp_fixed / runs, power_auto=power_auto,
               wrong_auto=outcome.wrong_auto / variant_runs,
               mean_seeds_auto=outcome.seeds_auto / runs,
               mean_seeds_variant=outcome.seeds_variant / variant_runs,
               fixed_seeds=fixed_seeds,
               power_fixed_at_fixed_seeds=(float(power_fixed[reached[0]]) if len(reached)
                                           else None),
               power_fixed_max=float(power_fixed[-1]), group=group, max_seeds=most,
               fpr_group=outcome.fp_group / runs,
               fpr_group_low=_rate_interval(outcome.fp_group, runs)[0],
               fpr_group_high=_rate_interval(outcome.fp_group, runs)[1],
               fpr_group_symmetric=outcome.fp_group_symmetric / runs,
               power_group=power_group, wrong_group=outcome.wrong_group / variant_runs,
               mean_seeds_group=outcome.seeds_group / runs,
               mean_seeds_group_variant=outcome.seeds_group_variant / variant_runs,
               fixed_seeds_group=fixed_seeds_group)
    for n in (8, 12, 16):  # the fixed test alone at fewer seeds (where auto:MAX stops)
        if n % group == 0 and n <= most:
            row[f"fpr_fixed_at_{n}"] = int(outcome.fp_fixed_looks[n // group - 1]) / runs
    return row


def _cell(value: object) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def print_table(rows: list[dict]) -> None:
    columns = ["family", "variants", "fpr_auto", "fpr_peeking", "fpr_fixed", "fpr_fixed_at_12",
               "power_auto",
               "mean_seeds_auto", "fixed_seeds", "power_fixed_max", "fpr_group", "power_group",
               "mean_seeds_group", "fixed_seeds_group"]
    body = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in body)) for i, c in enumerate(columns)]
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for line in body:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=1000, help="simulated runs per family")
    parser.add_argument("--group", type=int, default=2, help="seeds per group")
    parser.add_argument("--max", type=int, default=32, dest="most", help="MAX seeds")
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--resamples", type=int, default=4_999,
                        help="Monte Carlo sign flips of the fixed test beyond 16 seeds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--planned-out", type=Path, default=PLANNED_OUT)
    parser.add_argument("--planned-sims", type=int, default=2_000,
                        help="simulated runs per planned effect (0: skip that table)")
    parser.add_argument("--spending", default=SPEND,
                        help="the planned table's spending function (auto:MAX uses "
                             f"{SPEND})")
    parser.add_argument("--families", action=argparse.BooleanOptionalAction, default=True,
                        help="simulate the committed studies' families (--no-families: "
                             "only the planned table)")
    args = parser.parse_args(argv)
    if args.most < args.group or args.group < 1:
        parser.error(f"--max {args.most} must be at least --group {args.group} >= 1")
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    total = simulate_families(args, rng) if args.families else None
    if args.planned_sims:
        planned = planned_rows(args.planned_sims, args.alpha, rng, spend=args.spending)
        write_csv(args.planned_out, planned)
        print(f"at a planned effect (normal differences, one variant; {args.spending} "
              f"spending), {time.perf_counter() - start:.0f} s:")
        for row in planned:
            print("  " + ", ".join(f"{k}={_cell(v)}" for k, v in row.items()))
    if total is not None:
        fixed = total["fixed_seeds"] if total["fixed_seeds"] is not None else f">{args.most}"
        print(f"false_positive_rate={total['fpr_auto']:.4f} "
              f"naive_peeking_rate={total['fpr_peeking']:.4f} "
              f"mean_seeds_auto={total['mean_seeds_auto']:.2f} fixed_seeds={fixed}")


def simulate_families(args: argparse.Namespace, rng: np.random.Generator) -> dict:
    """The committed studies' families (``simulate``): their table written and printed; the
    pooled ``all`` row returned."""
    start = time.perf_counter()
    rows, pooled = [], Outcome()
    for family in families():
        outcome = simulate(family, args.sims, args.group, args.most, args.alpha,
                           args.resamples, rng)
        rows.append(summary_row(family.name, len(family.variants), outcome, args.group,
                                args.most))
        pooled = pooled.add(outcome)
    total = summary_row("all", sum(r["variants"] for r in rows), pooled, args.group, args.most)
    rows.append(total)
    write_csv(args.out, rows)
    print(f"{args.sims} runs per family, groups of {args.group}, max {args.most} seeds, "
          f"alpha {args.alpha}, {time.perf_counter() - start:.0f} s")
    print_table(rows)
    print(f"group-sequential (auto:MAX): false_positive_rate={total['fpr_group']:.4f} "
          f"(symmetric null {total['fpr_group_symmetric']:.4f}) power={total['power_group']:.3f} "
          f"mean_seeds={total['mean_seeds_group']:.2f} fixed_seeds_same_power="
          f"{total['fixed_seeds_group']}")
    return total

if __name__ == "__main__":
    main()
