"""A study: the variants of one run (``--vary``) times its seeds (``--seeds N|auto|auto:MAX``),
tested against a baseline; its spec, parsed once from ``spec.routine``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from transformer_lab.config.schema import value_name
from transformer_lab.config.spec import RunSpec
from transformer_lab.config.variants import as_list
from transformer_lab.errors import ConfigError
from transformer_lab.measures.group_sequential import GroupSequentialTest
from transformer_lab.measures.sequential import SequentialTest
from transformer_lab.results.console import console
from transformer_lab.results.progress import progress_bar
from transformer_lab.training.trainer import TrainResult

AUTO_GROUP = 2        # --seeds auto: seeds are trained (and the test updated) two at a time
AUTO_MAX_SEEDS = 32   # --seeds auto: at most this many paired seeds per variant (auto:MAX)
ALPHA = 0.05          # the verdicts' false-positive rate (over all variants together)
ANYTIME, GROUP_SEQUENTIAL = "anytime", "group"  # the two sequential designs
# Keys that are no variant of a run: what runs, the samples, Hydra's own, where it writes.
UNVARIED = ("routine", "seed", "hydra", "experiment", "out_root", "config_dirs", "force")


@dataclass(frozen=True)
class Study:
    """``key`` (a group or a dotted key; ``option``: as the user gave it) over ``values``, each
    trained with ``seeds`` and tested against ``baseline``; with a sequential ``design``
    (``--seeds auto``) at most those seeds, until the test decides."""

    key: str
    values: tuple[Any, ...]
    option: str
    baseline: str | None  # as given (``routine.baseline``); None: the first variant
    seeds: tuple[int, ...]
    design: str | None = None  # ANYTIME or GROUP_SEQUENTIAL with --seeds auto; None: fixed

    @property
    def names(self) -> list[str]:
        """Each value as the tables name it (``variant``)."""
        return [value_name(value) for value in self.values]


def study(spec: RunSpec) -> Study:
    """The study of ``spec.routine``: ``vary`` (else ``activations`` as ``ffn``; no values
    without either), ``seeds`` and ``baseline``, checked (``ConfigError``)."""
    routine = spec.routine
    vary = routine.get("vary")
    if vary is not None and vary.get("key") is not None:
        values = vary.get("values")
        listed = list(values) if isinstance(values, list) else []
        key, option = str(vary["key"]), f"--vary {vary['key']}"
    elif "activations" in routine:
        key, listed, option = "ffn", as_list(routine.get("activations")), "--activations"
    else:
        key, listed, option = "", [], "--vary"
    count, design = seed_plan(routine.get("seeds", 1))
    baseline = routine.get("baseline")
    planned = Study(key, tuple(listed), option,
                    None if baseline is None else value_name(baseline),
                    tuple(range(spec.seed, spec.seed + count)), design)
    names = planned.names
    if names and key.split(".")[0] in UNVARIED:
        raise ConfigError(f"{option} cannot vary: '{key}' is not a setting of the "
                          "model or its training (seeds: --seeds N)")
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConfigError(f"{option} lists {twice} twice: {','.join(names)}")
    if names and planned.baseline is not None and planned.baseline not in names:
        raise ConfigError(f"--baseline {planned.baseline} is not among the compared values of "
                          f"{key}; valid: {', '.join(names)}")
    return planned


def seed_plan(value: Any) -> tuple[int, str | None]:
    """``routine.seeds`` as (seeds, sequential design): N, ``auto``, ``auto:MAX`` or
    ``anytime:MAX`` (else ``ConfigError``)."""
    text = str(value).strip()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value, None
    if text == "auto":
        return AUTO_MAX_SEEDS, ANYTIME
    head, colon, most = text.partition(":")
    if head in ("auto", ANYTIME) and colon and most.isdigit() and int(most) >= AUTO_GROUP:
        return int(most), GROUP_SEQUENTIAL if head == "auto" else ANYTIME
    raise ConfigError(f"--seeds {text} (routine.seeds={text}): give a positive integer (that "
                      f"many seeds), auto[:MAX] (groups of {AUTO_GROUP} seeds until every "
                      f"variant has a verdict; auto:MAX a group-sequential design planned to "
                      f"MAX >= {AUTO_GROUP}, auto alone the anytime-valid test to "
                      f"{AUTO_MAX_SEEDS}) or anytime:MAX, e.g. --seeds 8 or --seeds auto:16")


@dataclass
class SeedRun:
    """One trained model of a study: its variant, seed, training and parameters; ``tags``: what
    its routine says of it in its rows (a comparison's activation, a reversal's pe)."""

    variant: str
    seed: int
    result: TrainResult
    params: int
    tags: dict[str, Any] = field(default_factory=dict)
    logged_steps: list[int] = field(default_factory=list)  # the step of each training loss
    parts: dict[str, int] = field(default_factory=dict)  # parameter counts by model part
    held_out: dict[str, Any] = field(default_factory=dict)  # the last held-out row
    trainer: dict[str, Any] | None = None  # the final ``Trainer.state_dict``, on the CPU


Run = TypeVar("Run")


def run_study(spec: Study, train_one: Callable[[str, int], Run], log: Any,
              bar: Callable[[str, list[int]], tuple[str, int]],
              variants: Sequence[str] | None = None) -> tuple[list[Run], SequentialTest | None]:
    """``train_one(variant, seed)`` for every variant (default ``spec.names``, else one: ``""``)
    and seed, one after another, a progress bar ``bar(variant, seeds)`` (label, total) per
    variant and group of seeds; with ``--seeds auto``, groups of seeds for the baseline and the
    variants without a verdict yet, until the sequential test of their final losses decides."""
    variants = (spec.names or [""]) if variants is None else list(variants)
    runs: list[Run] = []

    def train(name: str, seeds: list[int]) -> list[Run]:
        label, total = bar(name, seeds)
        with progress_bar(log, label, total):
            trained = [train_one(name, seed) for seed in seeds]
        runs.extend(trained)
        return trained

    if spec.design is None:
        for name in variants:
            train(name, list(spec.seeds))
        return runs, None
    baseline = spec.baseline or variants[0]
    test = (GroupSequentialTest(variants, baseline, len(spec.seeds), alpha=ALPHA)
            if spec.design == GROUP_SEQUENTIAL else
            SequentialTest(variants, baseline, alpha=ALPHA, max_seeds=len(spec.seeds)))
    done, group = 0, AUTO_GROUP if spec.design == ANYTIME else 1  # seeds trained at a time
    while not test.done():
        seeds = list(spec.seeds[done:done + group])
        taking = {baseline, *test.running()}
        test.update_values({name: [run.result.final_loss for run in train(name, seeds)]
                            for name in variants if name in taking})
        done += len(seeds)
        console.print(running_line(test, done), markup=False)
    return runs, test


def running_line(test: SequentialTest, trained: int) -> str:
    """After a group: per variant, its running interval, statistic and state."""
    lines = [f"seeds auto ({test.design}), {trained} seeds trained:"]
    for name in test.variants:
        low, high = test.interval(name)
        state = test.verdict(name) or ("running" if not test.stopped_because(name)
                                       else "no verdict at MAX")
        lines.append(f"  {name} - {test.baseline}: [{low:.3g}, {high:.3g}] "
                     f"{test.describe(name)} after {test.seeds_used(name)} paired seeds: "
                     f"{state}")
    return "\n".join(lines)
