"""Train N seeds of one configuration as one vectorised model.

N separate runs of a small model pay N times the per-step overhead (Python, op dispatch,
optimiser bookkeeping). Here the N models' parameters are stacked along a leading seed axis
(``torch.func.stack_module_state``) and one step runs all of them: ``torch.func.vmap`` over
the model called with seed s's parameters swapped in (what ``torch.func.functional_call`` does,
without its per-call module walk) computes the N losses, one backward gives every
seed its own gradient, each seed's gradient is clipped by its own norm, and one AdamW over the
stacked tensors is N independent AdamWs (its update is element-wise; the step count and the
schedule are shared because every seed takes the same steps).

Each seed gets exactly what a single run with that seed gets: ``build_model(cfg,
seed=seed)`` (same initial weights), a data generator seeded with ``seed`` (same
batches; or the caller's fixed ``batches``), the same schedule, clipping and evaluations. The
numbers agree with N separate ``Trainer`` runs up to float rounding of batched matmuls (tested
to 1e-5 on the losses in ``tests/test_multiseed.py``).

API (shapes: batches are (B, T); the stacked parameters are (N, *shape))::

    from transformer_lab.training.multiseed import fit_seeds, vectorisable

    results = fit_seeds(cfg, seeds=[0, 1, 2, 3], steps=200,
                        task=None,                  # default: build_task(cfg)
                        models=None,                # default: build_seeded_models(cfg, seeds)
                        batches=None,               # or {seed: [Batch, ...]} fixed batches
                        metrics=None,               # or {seed: CsvLog}: one metrics log per seed
                        target_exact_match=None,    # per seed: stop (freeze) it once reached
                        on_step=None,               # fn(seed, step, loss) at log steps
                        vectorise=None)             # None: auto (below), True, False
    results[k]  # TrainResult of seeds[k], as Trainer.fit returns for a single run
    # models passed in are trained in place: afterwards models[k] holds seed k's weights
    vectorisable(cfg)  # None, or why the seeds run one after another (see below)

``wall_s`` and ``tokens_per_s`` of each result are those of the whole batched run (tokens of
that seed over the shared wall time). A seed that reaches ``target_exact_match`` stops counting:
its result and its weights are those of the step where it was solved, as in a separate run.

When it pays (``benchmarks/multiseed.py``, N = 4, wall time against one seed): on the 2-core
CPU (1 thread) batching pays only for overhead-bound steps: ``tiny`` at 64 x 4 tokens took 2.9x
against 4.1x for four sequential runs, while at the benchmark's ``small`` (64 x 16 tokens, d 64)
each seed's matmuls dominate and it took 4.7x against 4.0x. On an H200 (launch-bound) ``small``
took 2.2x against 4.2x. So ``vectorise=None`` batches the seeds when tokens x
d_model <= ``VECTORISE_MAX_WORK`` (8192) or on CUDA, and runs them one after another otherwise.
Under vmap, attention is written out (``written_out_attention``): SDPA's fused kernels have no
batching rule (vmap would loop over the seeds, and on CUDA the memory-efficient backward fails).

Fallback: configurations whose training is not a pure function of (weights, batch) cannot be
vectorised with equal numbers - BatchNorm (running statistics are module state updated in
place), any dropout > 0 (vmap draws different random numbers than a single run) and bf16
autocast (under vmap it leaves linear layers with a bias in fp32: seen with torch 2.11 on CUDA,
where the mixed dtypes crashed a backward, and 2.13 on CPU). For those
``fit_seeds`` trains the seeds one after another with ``Trainer`` (same results, no speed-up);
``vectorisable(cfg)`` says why.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch
from omegaconf import DictConfig
from torch import nn
from torch.func import stack_module_state, vmap

from transformer_lab.components.attention import written_out_attention
from transformer_lab.results.run_directory import CsvLog, TaggedLog
from transformer_lab.tasks import Batch, Task
from transformer_lab.training.trainer import (
    Trainer,
    TrainResult,
    adamw_param_groups,
    make_adamw,
    sequence_loss,
)

OnStep = Callable[[int, int, float], None]


def vectorisable(cfg: DictConfig) -> str | None:
    """None if ``cfg``'s seeds can train as one batched model, else the reason they cannot.

    A component whose class declares ``keeps_running_statistics = True`` (BatchNorm) holds
    module state updated in place, which vmap cannot give each seed."""
    from transformer_lab.config.knowledge import declared

    for group in ("norm_layer", "block", "ffn", "pe"):
        if group in cfg and declared(cfg[group], "keeps_running_statistics") is True:
            return (f"{group}={cfg[group].get('name')} keeps running statistics "
                    "(module state)")
        # a component that says why its seeds must run one after another (ffn=moe)
        reason = declared(cfg[group], "seeds_one_after_another") if group in cfg else None
        if isinstance(reason, str):
            return reason
    dropouts = {k: float(v) for k, v in cfg.model.dropout.items() if v}
    if dropouts:
        return f"dropout {dropouts} draws random numbers that vmap cannot reproduce per seed"
    if cfg.train.get("precision") == "bf16":
        return ("train.precision=bf16: under vmap, autocast skips linear layers with a bias "
                "(they would run in fp32, unlike a single run)")
    return None


VECTORISE_MAX_WORK = 8192  # tokens per step x d_model below which batching seeds pays on CPU


def worth_vectorising(cfg: DictConfig, task: Task,
                      batches: Mapping[int, Sequence[Batch]] | None = None) -> bool:
    """Auto choice: batch the seeds on CUDA, or on CPU when a step is small enough to be
    overhead-bound (tokens per step x d_model <= ``VECTORISE_MAX_WORK``; see the docstring)."""
    if str(cfg.train.device).startswith("cuda"):
        return True
    if batches:
        tokens = next(iter(batches.values()))[0].inputs.numel()
    else:
        tokens = int(cfg.train.batch_size) * int(task.model_seq_len)
    return tokens * int(cfg.model.d_model) <= VECTORISE_MAX_WORK


def _has_module_state(model: nn.Module) -> str | None:
    for module in model.modules():
        if getattr(type(module), "keeps_running_statistics", False) is True or isinstance(
                module, nn.modules.batchnorm._BatchNorm):
            return f"{type(module).__name__} keeps running statistics (module state)"
        if isinstance(module, nn.Dropout) and module.p > 0:
            return f"dropout p={module.p} draws random numbers that vmap cannot reproduce"
        if isinstance(getattr(module, "dropout", None), float) and module.dropout > 0:
            return f"attention dropout p={module.dropout} draws random numbers"
    return None


def _parameter_slots(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(module, attribute, name in named_parameters) for every parameter slot, tied ones too."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [(module, attr, names[id(param)])
            for module in model.modules()
            for attr, param in module._parameters.items() if param is not None]


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
) -> list[TrainResult]:
    """Train ``seeds`` for ``steps`` steps each (or ``steps[seed]``: a budget per seed); one
    ``TrainResult`` per seed (module docstring). ``horizon``: the steps the schedule plans for,
    as in ``Trainer.fit`` (default: each seed's budget; budgets that differ without a shared
    horizon run one after another, since one batched schedule cannot follow several)."""
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
    models = list(models)
    budgets = [int(steps[s]) if isinstance(steps, Mapping) else int(steps) for s in seeds]
    metrics = metrics or {}
    trainers = [Trainer(m, task, cfg.train, cfg.model.d_model, s, metrics.get(s))
                for m, s in zip(models, seeds, strict=True)]
    reason = vectorisable(cfg) or _has_module_state(models[0])
    if reason is not None and len(seeds) > 1:  # say which way the seeds train, and why
        from transformer_lab.results.console import console

        console.print(f"seeds {list(seeds)} train one after another, not batched: {reason}")
    if vectorise is None:
        vectorise = worth_vectorising(cfg, task, batches)
    one_horizon = horizon is not None or len(set(budgets)) == 1
    if reason is not None or len(seeds) == 1 or not vectorise or not one_horizon:
        return [trainer.fit(budget, batches=None if batches is None else batches[seed],
                            target_exact_match=target_exact_match,
                            on_step=None if on_step is None
                            else (lambda step, loss, s=seed: on_step(s, step, loss)),
                            horizon=horizon)
                for trainer, seed, budget in zip(trainers, seeds, budgets, strict=True)]
    return _VectorisedRun(cfg, list(seeds), models, trainers, batches,
                          horizon or budgets[0]).fit(budgets, target_exact_match, on_step)


class _VectorisedRun:
    """The stacked parameters, their optimiser and the shared training loop."""

    def __init__(self, cfg: DictConfig, seeds: list[int], models: list[nn.Module],
                 trainers: list[Trainer], batches: Mapping[int, Sequence[Batch]] | None,
                 horizon: int) -> None:
        self.cfg = cfg
        self.seeds = seeds
        self.models = models
        self.trainers = trainers
        self.batches = batches
        self.train = trainers[0]._train  # plain copy of cfg.train
        self.device = trainers[0].device
        params, _ = stack_module_state(models)  # name -> (N, *shape) leaves
        self.params = params
        self.names = list(params)
        # Each seed's model keeps views into the stacked tensors, so it always holds the
        # current weights (evaluation, exact match and the caller use them unchanged).
        for k, model in enumerate(models):
            for name, param in model.named_parameters():
                param.data = params[name].detach()[k]
        stacked = [params[n] for n in self.names]
        groups = adamw_param_groups(stacked, float(cfg.train.weight_decay), leading_dims=1)
        self.schedule = trainers[0].schedule
        self.d_model = trainers[0].d_model
        self.horizon = horizon  # the schedule's total steps, shared by every seed
        self.lr = self.schedule(1, self.train, self.d_model, horizon)
        self.optimizer = make_adamw(groups, self.lr, tuple(cfg.train.betas))
        self.grad_clip = trainers[0]._grad_clip
        self.autocast = trainers[0].autocast
        base = models[0]
        slots = _parameter_slots(base)

        def seed_loss(seed_params: dict[str, torch.Tensor], inputs: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
            # functional_call(base, seed_params, (inputs,)) without its per-call module walk
            saved = [module._parameters[attr] for module, attr, _ in slots]
            try:
                for module, attr, name in slots:
                    module._parameters[attr] = seed_params[name]
                logits = base(inputs)  # (B, T, V) for this seed
            finally:
                for (module, attr, _), param in zip(slots, saved, strict=True):
                    module._parameters[attr] = param
            return sequence_loss(logits, targets)

        self.losses = vmap(seed_loss)  # (params (N, ...), inputs (N, B, T), targets) -> (N,)

    def next_batches(self, i: int) -> list[Batch]:
        if self.batches is not None:
            return [self.batches[s][i % len(self.batches[s])] for s in self.seeds]
        return [t.task.train_batch(self.train.batch_size, t.generator) for t in self.trainers]

    def clip(self) -> torch.Tensor:
        """Clip each seed's gradient by its own total norm, as ``clip_gradients`` does for one
        run (the same per-tensor norms, in one ``_foreach_norm`` over every seed's slices);
        returns the norms (N,)."""
        grads = [self.params[n].grad for n in self.names if self.params[n].grad is not None]
        n = len(self.seeds)
        slices = [[g[k] for g in grads] for k in range(n)]  # seed k's gradient tensors
        per_tensor = torch._foreach_norm([s for seed in slices for s in seed])  # N * P norms
        total = torch.linalg.vector_norm(torch.stack(per_tensor).view(n, -1), dim=1)  # (N,)
        if math.isfinite(self.grad_clip):
            coef = (self.grad_clip / (total + 1e-6)).clamp_(max=1.0)  # (N,)
            for k in range(n):
                torch._foreach_mul_(slices[k], coef[k])
        return total

    def step(self, batches: list[Batch]) -> tuple[torch.Tensor, torch.Tensor, float]:
        for trainer in self.trainers:
            trainer.step_count += 1
        lr = self.schedule(self.trainers[0].step_count, self.train, self.d_model, self.horizon)
        if lr != self.lr:
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.lr = lr
        inputs = torch.stack([b.inputs for b in batches]).to(self.device)  # (N, B, T)
        targets = torch.stack([b.targets for b in batches]).to(self.device)  # (N, B, T)
        for model in self.models:
            if not model.training:
                model.train()
        with self.autocast, written_out_attention():  # what vmap batches (see there)
            losses = self.losses(self.params, inputs, targets)  # (N,)
        for p in self.params.values():
            p.grad = None
        losses.sum().backward()  # seeds are independent: each gets its own gradient
        norms = self.clip()
        self.optimizer.step()
        return losses.detach(), norms, lr

    def fit(self, budgets: list[int], target_exact_match: float | None,
            on_step: OnStep | None) -> list[TrainResult]:
        """Train until every seed is solved or has taken its budget of steps. A seed that stops
        earlier than the others is frozen: the batched step still updates its slice of the
        stacked weights, and its weights of the step where it stopped are put back at the end."""
        n = len(self.seeds)
        results = [TrainResult() for _ in range(n)]
        active = list(range(n))
        frozen: dict[int, dict[str, torch.Tensor]] = {}  # stopped seed -> its weights then
        log_every, eval_every = max(1, int(self.train.log_every)), self.train.eval_every
        started = clock = time.perf_counter()
        tokens_since = total_tokens = 0
        for i in range(max(budgets)):
            if not active:
                break
            batches = self.next_batches(i)
            losses, norms, lr = self.step(batches)
            tokens_since += batches[0].inputs.numel()
            total_tokens += batches[0].inputs.numel()
            step = self.trainers[0].step_count
            last = {k for k in active if step == budgets[k]}
            logging = [k for k in active if step % log_every == 0 or k in last]
            if logging:
                loss_values, norm_values = losses.tolist(), norms.tolist()  # one sync
                now = time.perf_counter()
                for k in logging:
                    self.trainers[k].record_train(
                        results[k], step, loss_values[k], norm_values[k], lr,
                        tokens_since / max(now - clock, 1e-9),
                        None if on_step is None
                        else (lambda step, loss, s=self.seeds[k]: on_step(s, step, loss)),
                        who=f"seed {self.seeds[k]}: ")
                tokens_since, clock = 0, now
            evaluating = [k for k in active
                          if (eval_every and step % eval_every == 0) or k in last]
            for k in evaluating:
                solved = self.trainers[k].record_eval(results[k], step, lr, target_exact_match)
                if solved or k in last:
                    active.remove(k)
                    results[k].steps = step
                    frozen[k] = {name: self.params[name][k].detach().clone()
                                 for name in self.names}
        with torch.no_grad():  # a solved seed keeps the weights of the step it was solved
            for k, weights in frozen.items():
                for name, value in weights.items():
                    self.params[name][k].copy_(value)
        wall = time.perf_counter() - started
        for k, result in enumerate(results):
            result.steps = result.steps or self.trainers[k].step_count
            result.wall_s = wall
            result.tokens_per_s = total_tokens / max(wall, 1e-9)
        return results
