"""``tlab compare --vary KEY=V1,V2,...`` and ``tlab compare-activations`` (``--vary ffn=...``,
validate's step 4): the same run once per value, every variant over the same seeds, with a
paired verdict against the baseline. Setup, columns and ``--seeds auto``: docs/routines.md.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich import box
from rich.table import Table
from torch import nn

from transformer_lab.config.architecture import check_architecture
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.knowledge import declared
from transformer_lab.config.schema import POSITIVE_INT, Rule, check_schema, number_rule
from transformer_lab.config.tree import group_choices, user_config_dirs
from transformer_lab.errors import ConfigError
from transformer_lab.measures.group_sequential import GroupSequentialTest
from transformer_lab.measures.sequential import STOPPED_VERDICT, SequentialTest
from transformer_lab.measures.statistics import (
    BASELINE,
    NO_DIFFERENCE,
    VERDICT_COLUMNS,
    describe,
    has_verdict,
    verdict_table,
)
from transformer_lab.model import build_checked_model, build_model
from transformer_lab.results.check_rows import CheckRow, Stopwatch, status
from transformer_lab.results.console import console, print_table
from transformer_lab.results.curve_metrics import early_loss, late_loss_std
from transformer_lab.results.progress import progress_bar
from transformer_lab.results.run_directory import CsvLog, RunDirectory, weights_path
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.routines.objective import Objective, chosen_variant_loss
from transformer_lab.routines.train import mean_or_nan, perplexity
from transformer_lab.routines.variants import (
    as_list,
    is_group,
    seed_list,
    seed_sources,
    stage_log,
    train_settings,
    with_value,
)
from transformer_lab.tasks import Task
from transformer_lab.training.checkpoint import save_weights
from transformer_lab.training.optimizers import check_optimizer
from transformer_lab.training.trainer import Trainer, count_parameters

# --------------------------------------------------------------------------------------------
# the variation and its checks


@dataclass(frozen=True)
class Variation:
    """``key`` (a group or a dotted key) over ``values``; ``option``: as the user gave it."""

    key: str
    values: tuple[Any, ...]
    option: str

    @property
    def names(self) -> list[str]:
        """Each value as the tables name it (``variant``)."""
        return [value_name(value) for value in self.values]


def value_name(value: Any) -> str:
    """A value as written on a command line: ``rope``, ``0.001``, ``true``, ``null``."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "[" + ",".join(value_name(v) for v in value) + "]"
    return str(value)





def variation(cfg: DictConfig) -> Variation:
    """``routine.vary``, else ``routine.activations`` as ``ffn``; no values without either."""
    vary = cfg.routine.get("vary")
    if vary is not None and vary.get("key") is not None:
        values = vary.get("values")  # (not vary.values: a DictConfig's method)
        listed = OmegaConf.to_container(values, resolve=True) \
            if isinstance(values, ListConfig) else []
        return Variation(str(vary.key), tuple(listed), f"--vary {vary.key}")
    if "activations" in cfg.routine:
        return Variation("ffn", tuple(as_list(cfg.routine.get("activations"))), "--activations")
    return Variation("", (), "--vary")


def variant_configs(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """(name, config) of every variant, in the order given."""
    vary = variation(cfg)
    return [(name, with_value(cfg, vary.key, value))
            for name, value in zip(vary.names, vary.values, strict=True)]


def baseline_of(cfg: DictConfig) -> str | None:
    """The baseline variant's name (``routine.baseline``; None: the first)."""
    baseline = cfg.routine.get("baseline")
    return None if baseline is None else value_name(baseline)


AUTO_GROUP = 2        # --seeds auto: seeds are trained (and the test updated) two at a time
GROUP_SEQUENTIAL_GROUP = 1  # --seeds auto:MAX: the planned design looks after every seed
AUTO_MAX_SEEDS = 32   # --seeds auto: at most this many paired seeds per variant (auto:MAX)
ALPHA = 0.05          # the verdicts' false-positive rate (over all variants together)
ANYTIME, GROUP_SEQUENTIAL = "anytime", "group"  # the two sequential designs


@dataclass(frozen=True)
class SeedPlan:
    """``routine.seeds``: ``count`` fixed seeds, or (``auto``) at most ``count`` seeds tested
    with ``design`` as they come."""

    count: int
    auto: bool = False
    design: str = ANYTIME


def seed_plan(cfg: DictConfig) -> SeedPlan:
    """``routine.seeds``: N, ``auto``, ``auto:MAX`` or ``anytime:MAX`` (else ``ConfigError``)."""
    value = cfg.routine.get("seeds", 1)
    text = str(value).strip()
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return SeedPlan(value)
    if text == "auto":
        return SeedPlan(AUTO_MAX_SEEDS, auto=True)
    head, colon, most = text.partition(":")
    if head in ("auto", ANYTIME) and colon and most.isdigit() and int(most) >= AUTO_GROUP:
        return SeedPlan(int(most), auto=True,
                        design=GROUP_SEQUENTIAL if head == "auto" else ANYTIME)
    raise ConfigError(f"--seeds {text} (routine.seeds={text}): give a positive integer (that "
                      f"many seeds), auto[:MAX] (groups of {AUTO_GROUP} seeds until every "
                      f"variant has a verdict; auto:MAX a group-sequential design planned to "
                      f"MAX >= {AUTO_GROUP}, auto alone the anytime-valid test to "
                      f"{AUTO_MAX_SEEDS}) or anytime:MAX, e.g. --seeds 8 or --seeds auto:16")


# The routine's own keys (``routines.check_settings``); ``loss_target`` null: the loss every
# run reaches.
SETTINGS = {"activations": Rule("list", item=Rule("str"), min_items=1),
            "vary.key": Rule("str", nullable=True),
            "vary.values": Rule("list", min_items=1, nullable=True),
            "baseline": Rule("any", nullable=True),  # one of the values: check_config
            "steps": POSITIVE_INT, "seeds": Rule("any"),  # N or auto[:MAX]: seed_plan
            "shared_init": Rule("bool"),
            "loss_target": number_rule(0, open_low=True, nullable=True)}
# Keys that are no variant of a run: what runs, the samples, Hydra's own, where it writes.
UNVARIED = ("routine", "seed", "hydra", "experiment", "out_root", "config_dirs", "force")


def check_values(cfg: DictConfig) -> None:
    """Before the task is built: ``routine.seeds`` is N or auto[:MAX]."""
    seed_plan(cfg)


def check_config(cfg: DictConfig, inputs: JobInputs) -> None:
    """Pre-flight: a variation that can vary, values listed once, the baseline among them, and
    every variant's config passing the run's own checks."""
    vary = variation(cfg)
    seed_plan(cfg)
    if not vary.values:
        if vary.option == "--activations":
            valid = ", ".join(group_choices("ffn", user_config_dirs(cfg)))
            raise ConfigError(f"routine.activations is empty; give one or more of: {valid}")
        raise ConfigError("tlab compare needs --vary KEY=V1,V2,... (a config group or key and "
                          "its values), e.g. --vary pe=rope,alibi,t5 or --vary train.lr=1e-3,3e-3")
    if vary.key.split(".")[0] in UNVARIED:
        raise ConfigError(f"{vary.option} cannot vary: '{vary.key}' is not a setting of the "
                          "model or its training (seeds: --seeds N)")
    names = vary.names
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ConfigError(f"{vary.option} lists {twice} twice: {','.join(names)}")
    baseline = baseline_of(cfg)
    if baseline is not None and baseline not in names:
        raise ConfigError(f"--baseline {baseline} is not among the compared values of "
                          f"{vary.key}; valid: {', '.join(names)}")
    for name, value in zip(names, vary.values, strict=True):
        check_variant(cfg, vary, name, value)


def check_variant(cfg: DictConfig, vary: Variation, name: str, value: Any) -> None:
    """The pre-flight of one variant: ``ConfigError`` prefixed with ``KEY=VALUE``."""
    what = "activation" if vary.option == "--activations" else vary.key
    try:
        if is_group(cfg, vary.key) and not isinstance(value, str):
            raise ConfigError(f"a {vary.key} choice is a name; valid: "
                              f"{', '.join(group_choices(vary.key, user_config_dirs(cfg)))}")
        variant = with_value(cfg, vary.key, value)
        check_schema(variant)
        check_architecture(variant)
        task = build_task(variant)
        model = build_checked_model(variant, task.model_seq_len)
        check_optimizer(train_settings(variant).optimizer, model)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith(f"unknown {vary.key} "):  # an unknown choice: say where it was
            message = message.replace(f"unknown {vary.key} ", f"unknown {what} ", 1)
            message = message.replace(";", f" in {vary.option};", 1)
            raise ConfigError(message) from None
        raise ConfigError(f"{vary.option}={name}: {message}") from None


# --------------------------------------------------------------------------------------------
# the training


def train_seeds(cfg: DictConfig, seeds: Sequence[int], log: CsvLog | None,
                stage: str = "compare", variant: str | None = None,
                initial: dict[int, dict[str, torch.Tensor]] | None = None,
                keep: Callable[[nn.Module, int, Task], None] | None = None) -> list[SeedRun]:
    """Train one variant of ``cfg`` (``variant``; default its ffn) with each of ``seeds`` for
    ``routine.steps``, one after another. ``initial`` (seed -> parameter values) shares initial
    weights between variants (``start_from``); ``keep(model, seed, task)`` gets each trained
    model."""
    activation = str(cfg.ffn.get("name"))
    variant = activation if variant is None else variant
    task, settings = build_task(cfg), train_settings(cfg)
    tokens_per_step = settings.batch_size * task.model_seq_len
    gated = declared(cfg.ffn, "weight_matrices") == 3
    runs = []
    for seed in seeds:
        init_seed, data_seed = seed_sources(cfg, seed)
        model = build_model(cfg, seed=init_seed)
        if initial is not None:
            if seed in initial:
                start_from(model, initial[seed])
            else:
                initial[seed] = {name: p.detach().clone() for name, p in model.named_parameters()}
        parts = parameter_parts(model)
        logged: list[tuple[int, float]] = []  # (step, perf_counter) at each logged step
        trainer = Trainer(model, task, settings, data_seed,
                          stage_log(log, stage, variant, seed))
        result = trainer.fit(int(cfg.routine.steps), on_step=lambda step, loss, logged=logged:
                             logged.append((step, time.perf_counter())))
        if keep is not None:
            keep(model, seed, task)
        speeds = [tokens_per_step * (s1 - s0) / (t1 - t0)
                  for (s0, t0), (s1, t1) in zip(logged, logged[1:], strict=False) if t1 > t0]
        runs.append(SeedRun(activation, seed, count_parameters(model), parts.get("ffn", 0),
                            result.steps, result.final_loss, result.wall_s,
                            result.train_losses, [step for step, _ in logged], result.grad_norms,
                            statistics.median(speeds) if speeds else result.tokens_per_s,
                            variant=variant, parts=parts, gated_ffn=gated))
    return runs


def start_from(model: nn.Module, initial: dict[str, torch.Tensor]) -> list[str]:
    """Copy into ``model`` every parameter of ``initial`` with the same name and shape;
    returns the names copied."""
    copied = []
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            value = initial.get(name)
            if value is not None and value.shape == parameter.shape:
                parameter.copy_(value)
                copied.append(name)
    return copied


def keep_weights_of(run: RunDirectory, cfg: DictConfig, variant: str, varied: str,
                    first_index: int, seeds: Sequence[int], model: nn.Module, seed: int,
                    task: Task) -> None:
    """One (variant, seed)'s final weights in ``models/<variant>/seed<k>.safetensors``."""
    index = first_index + list(seeds).index(seed)
    save_weights(model, weights_path(run.path, seed, variant), cfg, seed, index=index,
                 variant=variant, varied=varied, tokenizer=getattr(task, "tokenizer", None))


# Where a parameter lives, by the first part of its name below ``blocks.<i>.`` (or at the top).
MODEL_PARTS = {"token_embedding": "embedding", "positional": "pe", "attention": "attention",
               "feedforward": "ffn", "lm_head": "head"}


def parameter_parts(model: nn.Module) -> dict[str, int]:
    """Parameter counts by part (``MODEL_PARTS``; any other name counts as ``norms``)."""
    parts: dict[str, int] = {}
    for name, parameter in model.named_parameters():
        words = name.split(".")
        word = words[2] if words[0] == "blocks" and len(words) > 2 else words[0]
        part = MODEL_PARTS.get(word, "norms")
        parts[part] = parts.get(part, 0) + parameter.numel()
    return parts


def comparison(cfg: DictConfig, run: RunDirectory, keep_weights: bool = False
               ) -> tuple[list[SeedRun], list[dict]]:
    """Every variant trained with the same seeds (``routine.seeds``; ``auto[:MAX]``: until the
    sequential test decides), ``comparison.csv`` written: every ``SeedRun`` and the rows."""
    runs, test = train_variants(cfg, run, keep_weights)
    return runs, write_comparison(cfg, run, runs, test)


def train_variants(cfg: DictConfig, run: RunDirectory, keep_weights: bool = False
                   ) -> tuple[list[SeedRun], SequentialTest | None]:
    """Every variant's seeds trained: the runs, and the sequential test with ``auto[:MAX]``."""
    if seed_plan(cfg).auto:
        return compare_runs_until_decided(cfg, run, keep_weights)
    trainer = VariantTrainer(cfg, run, "compare", keep_weights)
    for name, variant in variant_configs(cfg):
        trainer.train(name, variant, seed_list(cfg))
    return trainer.runs, None


def write_comparison(cfg: DictConfig, run: RunDirectory, runs: list[SeedRun],
                     test: SequentialTest | None) -> list[dict]:
    """The rows and verdicts of trained variants, written as ``comparison.csv``."""
    rows = comparison_rows(runs, cfg.routine.get("loss_target"), baseline_of(cfg),
                           variation(cfg).key)
    run.write_table("comparison", with_seed_columns(rows, test), COMPARISON_COLUMNS)
    return rows


def compare_runs_until_decided(cfg: DictConfig, run: RunDirectory, keep_weights: bool = False
                               ) -> tuple[list[SeedRun], SequentialTest]:
    """``--seeds auto[:MAX]``: groups of ``AUTO_GROUP`` seeds (``auto:MAX``: one seed at a
    time), each group training the baseline and the variants still without a verdict, until
    every variant has one or MAX paired seeds."""
    plan, configs = seed_plan(cfg), variant_configs(cfg)
    names = [name for name, _ in configs]
    baseline = baseline_of(cfg) or names[0]
    test = (GroupSequentialTest(names, baseline, max_seeds=plan.count, alpha=ALPHA)
            if plan.design == GROUP_SEQUENTIAL else
            SequentialTest(names, baseline, alpha=ALPHA, max_seeds=plan.count))
    trainer = VariantTrainer(cfg, run, "compare", keep_weights)
    start, trained = int(cfg.seed), 0
    group = GROUP_SEQUENTIAL_GROUP if plan.design == GROUP_SEQUENTIAL else AUTO_GROUP
    while not test.done():
        seeds = [start + trained + i for i in range(min(group, plan.count - trained))]
        taking = {baseline, *test.running()}
        finals = {name: [r.final_loss for r in trainer.train(name, variant, seeds)]
                  for name, variant in configs if name in taking}
        test.update_values(finals)
        trained += len(seeds)
        console.print(running_line(test, trained), highlight=False, markup=False)
    return trainer.runs, test


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


class VariantTrainer:
    """Trains a comparison's variants into one run directory, appending each to
    ``compare_runs.csv`` as it finishes; ``runs``: every ``SeedRun`` in the order trained."""

    def __init__(self, cfg: DictConfig, run: RunDirectory, stage: str, keep_weights: bool):
        self.cfg, self.run, self.stage, self.keep_weights = cfg, run, stage, keep_weights
        self.vary = variation(cfg)
        self.initial: dict[int, dict[str, torch.Tensor]] | None = \
            {} if cfg.routine.get("shared_init", False) else None
        self.runs_log = run.log("compare_runs", RUN_COLUMNS)
        self.runs: list[SeedRun] = []

    def train(self, name: str, variant: DictConfig, seeds: Sequence[int]) -> list[SeedRun]:
        label = name if self.vary.key == "ffn" else f"{self.vary.key}={name}"
        steps = int(self.cfg.routine.steps)
        seed_text = (f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}" if seeds[0] ==
                     int(self.cfg.seed) else f"seed {seeds[0]}" if len(seeds) == 1
                     else f"seeds {seeds[0]}-{seeds[-1]}")
        with progress_bar(self.run.metrics, f"{label}, {seed_text}: {steps} steps",
                          total=steps * len(seeds)):
            keep = partial(keep_weights_of, self.run, variant, name, self.vary.key,
                           len(self.runs), seeds) if self.keep_weights else None
            seed_runs = train_seeds(variant, seeds, self.run.metrics, self.stage, name,
                                    self.initial, keep)
        self.runs.extend(seed_runs)
        self.runs_log.write_all(r.as_row() for r in seed_runs)
        return seed_runs


# --------------------------------------------------------------------------------------------
# a seed's run, the rows, the verdicts and the checks


SMOOTHING = 0.1  # EMA weight of the newest training loss in the smoothed curve

PARAMS_TOLERANCE = 0.05  # variants whose parameter count differs more from the baseline's: flagged

# The columns of compare-activations first, in their order; then a comparison's own.
COMPARISON_COLUMNS = ["variant", "varied", "activation", "params", "ffn_params",
                      "tokens_per_s", "rel_speed", "final_loss", "final_ppl", "grad_norm_mean",
                      "grad_norm_std", "steps_to_target", "seeds", "loss_target",
                      "final_loss_std", "first_loss", "steps", "final_loss_ci_low",
                      "final_loss_ci_high", *VERDICT_COLUMNS, "early_loss", "late_loss_std",
                      "params_vs_baseline", "params_note", "seeds_used", "stopped_because",
                      "e_value", "sequential_design"]
RUN_COLUMNS = ["activation", "seed", "params", "ffn_params", "tokens_per_s", "final_loss",
               "final_train_loss", "first_loss", "grad_norm_mean", "grad_norm_std", "steps",
               "wall_s", "early_loss", "late_loss_std", "variant"]


@dataclass
class SeedRun:
    """One variant trained with one seed (``variant``: its value; default its activation)."""

    activation: str
    seed: int
    params: int
    ffn_params: int
    steps: int
    final_loss: float  # held-out cross-entropy after the last step
    wall_s: float
    train_losses: list[float] = field(default_factory=list)  # one per logged step
    logged_steps: list[int] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    tokens_per_s: float = 0.0  # median over log intervals
    variant: str = ""
    parts: dict[str, int] = field(default_factory=dict)  # parameter counts (parameter_parts)
    gated_ffn: bool = False  # its FFN has three weight matrices (SwiGLU, GeGLU, ReGLU)

    @property
    def name(self) -> str:
        """The variant's name in the tables."""
        return self.variant or self.activation

    @property
    def smoothed(self) -> list[float]:
        return ema(self.train_losses, SMOOTHING)

    @property
    def early_loss(self) -> float:
        """Mean training loss over the first 10% of the steps (``curve_metrics``)."""
        return early_loss(self.logged_steps, self.train_losses)

    @property
    def late_loss_std(self) -> float:
        """Std of the training loss over the last 30% of the steps (``curve_metrics``)."""
        return late_loss_std(self.logged_steps, self.train_losses)

    def as_row(self) -> dict:
        return {"variant": self.name, "activation": self.activation, "seed": self.seed,
                "params": self.params, "ffn_params": self.ffn_params,
                "tokens_per_s": self.tokens_per_s, "final_loss": _exact(self.final_loss),
                "final_train_loss": self.smoothed[-1] if self.train_losses else math.nan,
                "first_loss": self.train_losses[0] if self.train_losses else math.nan,
                "grad_norm_mean": mean_or_nan(self.grad_norms),
                "grad_norm_std": _std(self.grad_norms), "steps": self.steps,
                "wall_s": self.wall_s, "early_loss": _exact(self.early_loss),
                "late_loss_std": _exact(self.late_loss_std)}


def ema(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average ``s_t = (1 - w) s_{t-1} + w v_t`` with ``s_0 = v_0``."""
    smoothed: list[float] = []
    for value in values:
        smoothed.append(value if not smoothed else (1 - weight) * smoothed[-1] + weight * value)
    return smoothed


def _exact(value: float) -> float | str:
    """``value`` in full precision (the CSV's 6 digits would blur small paired differences)."""
    return repr(float(value)) if math.isfinite(value) else value


def _std(values: Sequence[float]) -> float:
    return statistics.pstdev(values) if len(values) > 1 else 0.0


def runs_by_variant(runs: list[SeedRun]) -> dict[str, list[SeedRun]]:
    """Each variant's runs, variants in the order first seen."""
    by_variant: dict[str, list[SeedRun]] = {}
    for run in runs:
        by_variant.setdefault(run.name, []).append(run)
    return by_variant


def steps_to_target(run: SeedRun, target: float) -> int | None:
    """First logged step whose smoothed training loss is at or below ``target``."""
    for step, loss in zip(run.logged_steps, run.smoothed, strict=True):
        if loss <= target:
            return step
    return None


def comparison_rows(runs: list[SeedRun], loss_target: float | None,
                    baseline: str | None = None, varied: str = "ffn") -> list[dict]:
    """One ``comparison.csv`` row per variant (in the order first seen), seeds averaged, with
    the verdict columns against ``baseline`` (default the first variant)."""
    finals = [r.smoothed[-1] for r in runs if r.train_losses]
    target = loss_target if loss_target is not None else max(finals, default=math.nan)
    by_variant = runs_by_variant(runs)
    rows = []
    for name, seed_runs in by_variant.items():
        reached = [steps_to_target(r, target) for r in seed_runs]
        norms = [g for r in seed_runs for g in r.grad_norms]
        final = [r.final_loss for r in seed_runs]
        rows.append({
            "variant": name, "activation": seed_runs[0].activation,
            "params": seed_runs[0].params, "ffn_params": seed_runs[0].ffn_params,
            "tokens_per_s": mean_or_nan([r.tokens_per_s for r in seed_runs]),
            "final_loss": mean_or_nan(final), "final_ppl": perplexity(mean_or_nan(final)),
            "grad_norm_mean": mean_or_nan(norms), "grad_norm_std": _std(norms),
            "steps_to_target": None if None in reached else statistics.median(reached),
            "seeds": len(seed_runs), "loss_target": target, "final_loss_std": _std(final),
            "first_loss": mean_or_nan([r.train_losses[0] for r in seed_runs if r.train_losses]),
            "steps": seed_runs[0].steps,
            "early_loss": mean_or_nan([r.early_loss for r in seed_runs]),
            "late_loss_std": mean_or_nan([r.late_loss_std for r in seed_runs]), "varied": varied,
        })
    first_speed = rows[0]["tokens_per_s"] if rows else math.nan
    for row in rows:
        row["rel_speed"] = row["tokens_per_s"] / first_speed if first_speed else math.nan
    if runs:
        import pandas as pd

        per_seed = pd.DataFrame([{"variant": r.name, "seed": r.seed,
                                  "final_loss": r.final_loss} for r in runs])
        verdicts = verdict_table(per_seed, "variant", baseline=baseline)
        for row in rows:
            row.update(verdicts.loc[row["variant"]].to_dict())
        reference = by_variant[baseline_name(rows)][0]
        for row in rows:
            model = by_variant[row["variant"]][0]
            row["params_vs_baseline"] = model.params / reference.params - 1
            row["params_note"] = parameter_note(model, reference, varied)
    return rows


STOPPED_FIXED = "fixed"  # stopped_because of a fixed --seeds N comparison


def with_seed_columns(rows: list[dict], test: SequentialTest | None) -> list[dict]:
    """``seeds_used`` and ``stopped_because`` on every row; with ``test`` (``--seeds auto``)
    its verdict, interval and statistics replace the fixed test's."""
    for row in rows:
        row["seeds_used"] = row["seeds"]
        row["stopped_because"] = STOPPED_FIXED if test is None else ""
        name = row["variant"]
        if test is None or name not in test.variants:
            continue
        low, high = test.interval(name)
        row.update(verdict=test.verdict(name) or NO_DIFFERENCE, diff_ci_low=low,
                   diff_ci_high=high, **test.statistics(name), sequential_design=test.design,
                   seeds_used=test.seeds_used(name),
                   stopped_because=test.stopped_because(name),
                   note=f"seeds auto: {test.design} test, {test.describe(name)} after "
                        f"{test.seeds_used(name)} paired seeds"
                        + (f", {test.dropped[name]} non-finite dropped"
                           if test.dropped[name] else ""))
        if row["verdict"] == NO_DIFFERENCE:
            row["seeds_needed"] = None  # the fixed design's power figure does not apply
    return rows


def sequential_line(row: dict, baseline: str) -> str:
    """The terminal line of a ``--seeds auto`` verdict."""
    diff = row["diff_vs_baseline"]
    sign = -1.0 if diff < 0 else 1.0
    low, high = sorted((sign * row["diff_ci_low"], sign * row["diff_ci_high"]))
    stopped = "" if row["stopped_because"] == STOPPED_VERDICT else " (MAX seeds reached)"
    anytime = row.get("e_value") is not None
    statistic = (f"e-value {row['e_value']:.3g}" if anytime
                 else f"group-sequential p {row['p_value']:.3g}")
    return (f"{row['variant']} vs {baseline}: final_loss {abs(diff):.3g} "
            f"{'lower' if diff < 0 else 'higher'}, {'anytime' if anytime else 'repeated'} "
            f"{1 - ALPHA:.0%} interval {low:.3g} to {high:.3g}, {statistic} after "
            f"{row['seeds_used']} paired seeds{stopped} -> {row['verdict']}")


# What sizes each part of the model (``parameter_parts``), to match a variant's parameters.
SIZING_KNOBS = {"ffn": "model.d_ff (MoE: ffn.n_experts)",
                "attention": "model.n_heads, model.n_kv_heads or model.head_dim",
                "pe": "the PE's own size (model.max_len for a learned table; T5: "
                      "pe.num_buckets)",
                "embedding": "model.d_model or the task's vocabulary",
                "head": "model.tie_embeddings or the task's vocabulary",
                "norms": "norm_layer= (its gains and biases)"}
# Varied keys (and the keys below them) that size the model themselves: a different parameter
# count is what is compared.
SIZING_GROUPS = ("model", "preset", "task")


def parameter_note(run: SeedRun, baseline: SeedRun, varied: str) -> str:
    """Empty within ``PARAMS_TOLERANCE`` of the baseline's parameters, else how far off and
    how to match them."""
    change = run.params / baseline.params - 1
    if abs(change) <= PARAMS_TOLERANCE:
        return ""
    head = (f"{abs(change):.0%} {'more' if change > 0 else 'fewer'} parameters than "
            f"{baseline.name}")
    if varied.split(".")[0] in SIZING_GROUPS:
        return f"{head}: {varied} sizes the model (the difference is the point)"
    parts = set(run.parts) | set(baseline.parts)
    part = max(parts, key=lambda p: abs(run.parts.get(p, 0) - baseline.parts.get(p, 0)))
    if part == "ffn" and run.gated_ffn != baseline.gated_ffn and _about_three_halves(
            run.parts.get("ffn", 0), baseline.parts.get("ffn", 0)):
        return f"{head}: match them with model.gated_match_params=true (gated FFNs at 2/3 d_ff)"
    return f"{head}, most in its {part}: match them with {SIZING_KNOBS.get(part, part)}"


def _about_three_halves(a: int, b: int) -> bool:
    """A gated FFN against a two-matrix one of the same d_ff (about 3/2 the parameters)."""
    low, high = sorted((a, b))
    return low > 0 and 1.25 <= high / low <= 1.75


def baseline_name(rows: list[dict]) -> str:
    """The variant whose ``verdict`` is ``baseline`` (the first row if none is marked)."""
    return next((r["variant"] for r in rows if r.get("verdict") == BASELINE),
                rows[0]["variant"])


def verdict_lines(rows: list[dict]) -> list[str]:
    """One plain-language line per variant against the baseline."""
    baseline = baseline_name(rows)
    return [verdict_line(row, baseline) for row in rows if has_verdict(row)]


def verdict_line(row: dict, baseline: str) -> str:
    """``row``'s verdict against ``baseline`` in words (fixed or ``--seeds auto``)."""
    if row.get("sequential_design"):
        return sequential_line(row, baseline)
    return describe(row["variant"], row, baseline)





def comparison_checks(rows: list[dict], step: int = 4) -> list[CheckRow]:
    """One check per variant (``activation_gelu``; ``pe=alibi``): a finite, falling loss."""
    checks = []
    baseline = baseline_name(rows) if rows else None
    for row in rows:
        varied, name = row.get("varied", "ffn"), row["variant"]
        label = f"the FFN ({name})" if varied == "ffn" else f"{varied}={name}"
        finite = math.isfinite(row["final_loss"]) and math.isfinite(row["grad_norm_mean"])
        fell = finite and row["final_loss"] < row["first_loss"]
        detail = (f"loss {row['first_loss']:.3f} -> {row['final_loss']:.3f} (ppl "
                  f"{row['final_ppl']:.3g}), {row['tokens_per_s']:.0f} tok/s ("
                  f"{row['rel_speed']:.2f}x), grad norm {row['grad_norm_mean']:.3g} +- "
                  f"{row['grad_norm_std']:.2g}; a comparison: PASS = finite and falling")
        if not finite:
            detail += f"; non-finite loss or gradients: lower train.lr or check {label}"
        elif not fell:
            detail += f"; the loss did not fall: check {label}'s forward and its initialisation"
        if has_verdict(row):
            detail += f"; {verdict_line(row, baseline)}"
        check = f"activation_{name}" if varied == "ffn" else f"{varied}={name}"
        checks.append(CheckRow(step, check, status(fell), "final_loss", row["final_loss"],
                               "< first loss", 0.0, detail))
    return checks


# --------------------------------------------------------------------------------------------
# the terminal table and the plot


TABLE_HEADERS = {"variant": "variant", "params": "params", "ffn_params": "ffn",
                 "tokens_per_s": "tok/s", "rel_speed": "speed", "final_loss": "loss",
                 "final_ppl": "ppl", "grad_norm_mean": "|g|", "grad_norm_std": "sd",
                 "steps_to_target": "steps*", "seeds": "n", "verdict": "verdict"}


def comparison_table(rows: list[dict], title: str) -> Table:
    """The rows in a terminal table; a parameter count off the baseline's marked ``!``."""
    varied = rows[0].get("varied", "ffn") if rows else "variant"
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False,
                  caption="speed: tokens/s / the first's; |g|, sd: gradient norm mean and sd over "
                  "steps; steps*: steps to the loss every run reaches; n: seeds; no diff.: no "
                  f"detectable difference; !: parameters {PARAMS_TOLERANCE:.0%}+ off the "
                  "baseline's")
    widest = max([len(varied), *(len(str(row["variant"])) for row in rows)])
    for column, header in TABLE_HEADERS.items():
        table.add_column(varied if column == "variant" else header,
                         justify="left" if column in ("variant", "verdict") else "right",
                         no_wrap=True, min_width=widest if column == "variant" else None)
    for row in rows:
        cells = [_cell(row.get(c)) for c in TABLE_HEADERS]
        if row.get("params_note"):
            cells[1] += f" {row['params_vs_baseline']:+.0%}!"
        cells[-1] = VERDICT_CELLS.get(cells[-1], cells[-1])
        table.add_row(*cells)
    return table


VERDICT_CELLS = {NO_DIFFERENCE: "no diff."}  # the table's short form (comparison.csv: in full)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def plot_loss_curves(runs: list[SeedRun], path: Path, title: str) -> Path:
    """Smoothed training loss per variant: mean over seeds, min-max band."""
    from transformer_lab.results.plots import plt, save

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, seed_runs in runs_by_variant(runs).items():
        length = min(len(r.smoothed) for r in seed_runs)
        steps = seed_runs[0].logged_steps[:length]
        curves = torch.tensor([r.smoothed[:length] for r in seed_runs])  # (seeds, logged)
        label = f"{name} ({len(seed_runs)} seed{'s' if len(seed_runs) > 1 else ''})"
        (line,) = axes.plot(steps, curves.mean(0).tolist(), label=label)
        if len(seed_runs) > 1:
            axes.fill_between(steps, curves.min(0).values.tolist(),
                              curves.max(0).values.tolist(), color=line.get_color(), alpha=0.2)
    axes.set_xlabel("step")
    axes.set_ylabel(f"training loss (EMA {SMOOTHING})")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    return save(figure, path)


def run_compare(cfg: DictConfig, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    """Train every variant, write the tables and plot, print the verdicts; PASS when every
    variant trained to a finite, falling loss."""
    clock = Stopwatch()
    vary = variation(cfg)
    runs, rows = comparison(cfg, run, keep_weights=True)
    arch = "decoder" if cfg.arch.causal else "encoder"
    plot_loss_curves(runs, run.path / "loss_curves.png",
                     f"{cfg.task.get('name')}, {arch}, {vary.key}: {cfg.routine.steps} steps")
    command = "compare-activations" if vary.option == "--activations" else \
        f"compare --vary {vary.key}"
    print_table(comparison_table(rows, f"tlab {command} - {run.path}"))
    for row in rows:
        if row.get("params_note"):
            console.print(f"! {vary.key}={row['variant']}: {row['params_note']}",
                          highlight=False, markup=False)
    for line in verdict_lines(rows):
        console.print(line, highlight=False, markup=False)
    checks = comparison_checks(rows)
    failed = [c for c in checks if not c.passed]
    first = rows[0]
    summary = {"params": first["params"], "steps": first["steps"],
               "final_loss": first["final_loss"], "wall_s": clock.lap(),
               "tokens_per_s": first["tokens_per_s"]}
    return RoutineOutcome(passed=not failed, summary=summary,
                          message="; ".join(f"{c.check}: {c.detail}" for c in failed))


# What a hyper-parameter search (hydra/sweeper=optuna) gets from this routine.
OBJECTIVE = Objective("final_loss", "minimize", chosen_variant_loss)
