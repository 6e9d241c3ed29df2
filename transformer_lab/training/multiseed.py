"""Train S seeds of one configuration together, each with exactly the numbers of its own run.

S separate runs of a small model pay S times the per-step overhead (Python, op dispatch,
optimiser bookkeeping). ``fit_seeds`` trains them with one of three engines, and says which
(a line on the console, and a ``seed_engine`` column in the metrics rows of several seeds):

- ``stacked`` (``seed_stack``): one model whose leaf layers carry a leading seed axis (batched
  matmuls [S, B*T, in] @ [S, in, out], attention on (S*B, H, T, Dh) through SDPA, per-seed norm
  gains, BatchNorm statistics and PE tables, one AdamW over the stacked tensors). Needs every
  layer with parameters to have a stacked form (tlab's own do; ``seed_stack.stackable``).
- ``vmap`` (``vmap_seeds``): ``torch.func.vmap`` over the model with each seed's parameters;
  works for a user's own components too, but not for module state (BatchNorm).
- ``sequential``: one ``Trainer.fit`` after another (dropout, bf16, MoE's auxiliary loss,
  budgets that differ without a shared horizon, or where batching does not pay).

Each seed gets exactly what a single run with that seed gets: ``build_model(cfg, seed=seed)``
(same initial weights), a data generator seeded with ``seed`` (same batches; or the caller's
fixed ``batches``), the same schedule, per-seed gradient clipping and evaluations. The batched
engines agree with separate runs up to the float rounding of batched kernels (losses to 1e-5,
``tests/test_multiseed.py``).

API (shapes: batches are (B, T))::

    from transformer_lab.training.multiseed import fit_seeds, choose_engine

    results = fit_seeds(cfg, seeds=[0, 1, 2, 3], steps=200,
                        task=None,                  # default: build_task(cfg)
                        models=None,                # default: build_seeded_models(cfg, seeds)
                        batches=None,               # or {seed: [Batch, ...]} fixed batches
                        metrics=None,               # or {seed: CsvLog}: one metrics log per seed
                        target_exact_match=None,    # per seed: stop (freeze) it once reached
                        on_step=None,               # fn(seed, step, loss) at log steps
                        engine=None,                # None: auto; "stacked", "vmap", "sequential"
                        group=None)                 # stacked: seeds per group (None: by work)
    results[k]  # TrainResult of seeds[k], as Trainer.fit returns for a single run
    # models passed in are trained in place: afterwards models[k] holds seed k's weights

``wall_s`` and ``tokens_per_s`` of each result are those of its whole batched run (its
group's). A seed that reaches ``target_exact_match`` stops counting: its result and its weights
(BatchNorm statistics too) are those of the step where it was solved, as in a separate run.

Auto choice (``seed_engines.choose_engine``; ``benchmarks/multiseed.py``,
``benchmarks/multiseed.csv``): the stacked engine wherever the model stacks, in groups sized to
the CPU's cache (``seed_groups.group_size``: all seeds of an overhead-bound step such as
``tiny``'s, 8 of them 1.50x one seed; one at a time, i.e. one after another, for a step as large
as ``small``'s, where stacked activations spill out of cache; all of them on CUDA); else vmap
where batching pays (CUDA, or tokens per step x d_model <= ``seed_engines.BATCH_MAX_WORK`` on
CPU); else one after another. The batched engines get every seed's batch of a step as one
(S, B, T) tensor, drawn 64 steps at a time from each seed's own generator
(``seed_batches.SeedBatches``: the numbers of per-step draws). ``train.compile=true``: the
stacked engine compiles its model where it pays (``training/compile.py``); a group of one
compiles as its single run does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch
from omegaconf import DictConfig
from torch import nn

from transformer_lab.results.run_directory import CsvLog, TaggedLog
from transformer_lab.tasks import Batch, Task
from transformer_lab.training.compile import engine_probe
from transformer_lab.training.seed_batches import SeedBatches
from transformer_lab.training.seed_engines import choose_engine, vmap_refusal
from transformer_lab.training.trainer import Trainer, TrainResult

OnStep = Callable[[int, int, float], None]


def build_seeded_models(cfg: DictConfig, seeds: Sequence[int]) -> list[nn.Module]:
    """One model per seed, initialised as a single run with that seed would be."""
    from transformer_lab.model import build_model

    models = []
    for seed in seeds:
        models.append(build_model(cfg, seed=seed).to(cfg.train.device))
    return models


def fit_seeds(
    cfg: DictConfig,
    seeds: Sequence[int],
    steps: int | Mapping[int, int],
    *,
    task: Task | None = None,
    models: Sequence[nn.Module] | None = None,
    batches: Mapping[int, Sequence[Batch]] | None = None,
    metrics: Mapping[int, CsvLog | TaggedLog | None] | None = None,
    target_exact_match: float | None = None,
    on_step: OnStep | None = None,
    vectorise: bool | None = None,
    horizon: int | None = None,
    engine: str | None = None,
    group: int | None = None,
) -> list[TrainResult]:
    """Train ``seeds`` for ``steps`` steps each (or ``steps[seed]``: a budget per seed); one
    ``TrainResult`` per seed (module docstring). ``horizon``: the steps the schedule plans for,
    as in ``Trainer.fit`` (default: each seed's budget; budgets that differ without a shared
    horizon run one after another, since one batched schedule cannot follow several).
    ``engine``: force one of ``seed_engines.ENGINES``; ``vectorise`` (older form): True is
    ``vmap``, False is ``sequential``; ``group``: seeds per stacked group (default:
    ``seed_groups.group_size``)."""
    if not seeds:
        raise ValueError("fit_seeds needs at least one seed")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds {list(seeds)} repeat a seed")
    if task is None:
        from transformer_lab.config.instantiate import build_task

        task = build_task(cfg)
    if models is None:
        models = build_seeded_models(cfg, seeds)
    elif len(models) != len(seeds):
        raise ValueError(f"{len(models)} models for {len(seeds)} seeds")
    models, seeds = list(models), list(seeds)
    budgets = [int(steps[s]) if isinstance(steps, Mapping) else int(steps) for s in seeds]
    if group is not None and group < 1:
        raise ValueError(f"group={group} is not valid; a stacked group holds at least 1 seed")
    if engine is None and vectorise is False:
        engine = "sequential"
    elif engine is None and vectorise:  # the older vectorise=True: vmap where it can, else auto
        engine = None if vmap_refusal(cfg, models[0]) else "vmap"
    chosen = choose_engine(cfg, task, models, budgets, horizon, batches, engine, group)
    if len(seeds) > 1:
        from transformer_lab.results.console import console

        console.print(chosen.describe(seeds))
    several = len(seeds) > 1  # a single seed's rows stay as a plain run's
    logs = {s: TaggedLog(log, seed_engine=chosen.name) if several else log
            for s, log in (metrics or {}).items() if log is not None}
    trainers = [Trainer(m, task, cfg.train, cfg.model.d_model, s, logs.get(s))
                for m, s in zip(models, seeds, strict=True)]
    if chosen.name in ("single", "sequential"):
        return [_fit_alone(trainer, seed, budget, batches, target_exact_match, on_step, horizon)
                for trainer, seed, budget in zip(trainers, seeds, budgets, strict=True)]
    if chosen.name == "stacked":
        return _fit_stacked_groups(cfg, seeds, models, trainers, budgets, batches,
                                   target_exact_match, on_step, horizon, chosen.group)
    from transformer_lab.training.vmap_seeds import VmapSeeds

    runner = VmapSeeds(cfg, seeds, models, trainers, horizon or budgets[0])
    return train_together(runner, seeds, models, trainers, budgets, batches,
                          target_exact_match, on_step)


def _fit_alone(trainer: Trainer, seed: int, budget: int,
               batches: Mapping[int, Sequence[Batch]] | None, target_exact_match: float | None,
               on_step: OnStep | None, horizon: int | None) -> TrainResult:
    """Seed ``seed`` trained by its own ``Trainer``, as a single run."""
    return trainer.fit(budget, batches=None if batches is None else batches[seed],
                       target_exact_match=target_exact_match,
                       on_step=None if on_step is None
                       else (lambda step, loss: on_step(seed, step, loss)),
                       horizon=horizon)


def _fit_stacked_groups(cfg: DictConfig, seeds: list[int], models: list[nn.Module],
                        trainers: list[Trainer], budgets: list[int],
                        batches: Mapping[int, Sequence[Batch]] | None,
                        target_exact_match: float | None, on_step: OnStep | None,
                        horizon: int | None, group: int | None) -> list[TrainResult]:
    """The stacked engine: each group of ``group`` seeds (default: all) stacked and trained to
    its end, then the next (``seed_groups``); a group of one is its seed's single run."""
    from transformer_lab.training.seed_groups import StackedSeeds, seed_groups

    results: list[TrainResult] = []
    for rows in seed_groups(len(seeds), group or len(seeds)):
        part = [seeds[k] for k in rows]
        if len(rows) == 1:  # a group of one: the seed's single run
            results.append(_fit_alone(trainers[rows[0]], part[0], budgets[rows[0]], batches,
                                      target_exact_match, on_step, horizon))
            continue
        runner = StackedSeeds(cfg, part, [models[k] for k in rows],
                              [trainers[k] for k in rows], horizon or budgets[0])
        results += train_together(runner, part, [models[k] for k in rows],
                                  [trainers[k] for k in rows], [budgets[k] for k in rows],
                                  batches, target_exact_match, on_step)
    return results


class SeedSteps(Protocol):
    """A batched engine: one optimiser step of every seed (``batch``: inputs and targets
    (S, B, T), row k seed k's), which also advances every seed's ``Trainer.step_count``;
    returns the losses (S,), the gradient norms before clipping (S,) and the learning rate."""

    def step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]: ...


def train_together(runner: SeedSteps, seeds: list[int], models: list[nn.Module],
                   trainers: list[Trainer], budgets: list[int],
                   batches: Mapping[int, Sequence[Batch]] | None,
                   target_exact_match: float | None, on_step: OnStep | None
                   ) -> list[TrainResult]:
    """Train until every seed is solved or has taken its budget of steps; each seed's rows and
    evaluations go through its own ``Trainer`` (its model holds views of the batched weights).
    A seed that stops earlier than the others is frozen: the batched step still updates its
    slice, and its state of the step where it stopped is put back at the end."""
    n = len(seeds)
    train = trainers[0]._train
    results = [TrainResult() for _ in range(n)]
    active = list(range(n))
    frozen: dict[int, dict[str, torch.Tensor]] = {}  # stopped seed -> its state then
    log_every, eval_every = max(1, int(train.log_every)), train.eval_every
    started = clock = time.perf_counter()
    tokens_since = total_tokens = 0
    seed_batches = SeedBatches(trainers, seeds, max(budgets), batches, trainers[0].device)
    probe = engine_probe(runner, max(budgets)) if train.get("compile") else None
    for i in range(max(budgets)):
        if not active:
            break
        batch = seed_batches(i)  # (S, B, T): seed k's batch as its own run draws it
        losses, norms, lr = runner.step(batch)
        tokens_since += batch.inputs[0].numel()
        total_tokens += batch.inputs[0].numel()
        if probe is not None:
            probe.after_step(i)
        step = trainers[0].step_count
        last = {k for k in active if step == budgets[k]}
        logging = [k for k in active if step % log_every == 0 or k in last]
        if logging:
            loss_values, norm_values = losses.tolist(), norms.tolist()  # one sync
            now = time.perf_counter()
            for k in logging:
                trainers[k].record_train(
                    results[k], step, loss_values[k], norm_values[k], lr,
                    tokens_since / max(now - clock, 1e-9),
                    None if on_step is None
                    else (lambda step, loss, s=seeds[k]: on_step(s, step, loss)),
                    who=f"seed {seeds[k]}: ")
            tokens_since, clock = 0, now
        evaluating = [k for k in active if (eval_every and step % eval_every == 0) or k in last]
        for k in evaluating:
            solved = trainers[k].record_eval(results[k], step, lr, target_exact_match)
            if solved or k in last:
                active.remove(k)
                results[k].steps = step
                frozen[k] = {name: value.detach().clone()
                             for name, value in models[k].state_dict().items()}
    with torch.no_grad():  # a solved seed keeps the state of the step it was solved at
        for k, state in frozen.items():
            for name, value in models[k].state_dict().items():
                value.copy_(state[name])
    wall = time.perf_counter() - started
    for k, result in enumerate(results):
        result.steps = result.steps or trainers[k].step_count
        result.wall_s = wall
        result.tokens_per_s = total_tokens / max(wall, 1e-9)
    return results
