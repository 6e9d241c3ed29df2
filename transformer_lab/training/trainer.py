"""The training loop: one model on one task.

    settings = TrainSettings.from_mapping(train_keys, d_model=64)   # typed ``train.*``
    trainer = Trainer(model, task, settings, seed=0, metrics=run.metrics)
    result = trainer.fit(200)                   # TrainResult: steps, final_loss, curves, ...

Each step: the learning rate of the schedule (``schedules.SCHEDULES``) on every parameter group
of every optimiser, forward and loss (under bf16 autocast with ``precision="bf16"``), the model's
auxiliary loss (MoE load balancing) added, backward, ``torch.nn.utils.clip_grad_norm_`` and a
step of the optimisers ``settings.optimizer`` describes (``optimizers``: ``torch.optim.AdamW`` by
default, decay on matrices only; Muon on the hidden matrices and AdamW on the rest; any
``torch.optim.Optimizer``). Every ``log_every`` steps a ``train`` row, every ``eval_every``
steps and at the end a held-out ``val`` row; NaN/inf stops the run with ``Diverged`` after its
row is written. Several seeds are several trainers, one after another: each gets exactly the
numbers of a run of its own.

Every ``checkpoint_every`` steps (after that step's rows) ``fit`` hands its result to the
caller's ``on_checkpoint``, which saves ``Trainer.state_dict()`` (weights, optimiser states,
the schedule's position, torch's and the data generator's random states) with its own; a new
trainer given that state (``load_state_dict``) and the result goes on with the same numbers as
one that was never stopped. Under ``stop_between_steps`` (``tlab train``), SIGINT and SIGTERM
stop ``fit`` at the end of the current step: the state goes to ``on_checkpoint``, then
``errors.Interrupted`` is raised.

The global batch of a step is ``batch_size * grad_accum`` sequences, drawn at once (nanoGPT's
convention: ``batch_size`` is one forward's batch, ``grad_accum`` forwards make a step, so
``batch_size=B/4 grad_accum=4`` trains as ``batch_size=B``). Under torchrun (``distributed``)
every rank draws the same global batch and trains on its contiguous shard (1/N of the rows) in
``ceil(grad_accum / N)`` micro-batches; the loss is the mean over the scored tokens of the
whole global batch, so the numbers are those of one process. ``compile`` runs the model's
forward through ``torch.compile`` (evaluation and ``state_dict`` use the module itself).

Deterministic on CPU: the caller seeds the model's initialisation (``build_model(cfg, seed)``);
batches are drawn from a ``torch.Generator`` seeded with ``seed``, so the same settings and seed
give the same numbers.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from inspect import signature
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.errors import ConfigError, Diverged, Interrupted
from transformer_lab.results.run_directory import CsvLog
from transformer_lab.tasks import IGNORE_INDEX, Batch, Task
from transformer_lab.training import distributed
from transformer_lab.training.optimizers import OptimizerSet, build_optimizers
from transformer_lab.training.schedules import SCHEDULES
from transformer_lab.training.settings import TrainSettings


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over scored positions: logits (B, T, V), targets (B, T); in fp32
    (a no-op for fp32 logits), as autocast computes cross-entropy."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX)


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    scored = targets != IGNORE_INDEX
    return (logits.argmax(dim=-1) == targets)[scored].float().mean().item()


def model_auxiliary_loss(model: nn.Module) -> torch.Tensor | None:
    """The auxiliary loss the model's modules left from the last forward (a Mixture of
    Experts' load-balancing and z-loss; ``TransformerModel.auxiliary_loss``), or None. It is
    added to the training loss; the ``loss`` logged stays the cross-entropy."""
    collect = getattr(model, "auxiliary_loss", None)
    return collect() if callable(collect) else None


def model_auxiliary_metrics(model: nn.Module) -> dict[str, float]:
    """Extra ``metrics.csv`` columns about the last forward (e.g. ``moe_expert0_fraction``)."""
    collect = getattr(model, "auxiliary_metrics", None)
    return collect() if callable(collect) else {}


def scaled(value: torch.Tensor, factor: float) -> torch.Tensor:
    """``value * factor``; ``value`` itself for a factor of 1 (one process, one micro-batch:
    the same graph as without accumulation)."""
    return value if factor == 1.0 else value * factor


def runnable_model(model: nn.Module, device: torch.device, compile_model: bool
                   ) -> tuple[nn.Module | None, nn.Module]:
    """What a training step calls: ``model`` wrapped in ``DistributedDataParallel`` when this
    process is one of several (returned first, for ``no_sync``; else None), then through
    ``torch.compile`` when ``compile_model``; the parameters stay ``model``'s."""
    from torch.nn.parallel import DistributedDataParallel

    from transformer_lab.components.moe import MoEFeedForward

    parallel = None
    if distributed.joined():
        routed = any(isinstance(module, MoEFeedForward) for module in model.modules())
        # buffers are the same on every rank (position tables): not synchronised each forward
        no_buffer_sync = {"forward_sync_buffers" if "forward_sync_buffers" in
                          signature(DistributedDataParallel).parameters else "broadcast_buffers":
                          False}
        parallel = DistributedDataParallel(
            model, device_ids=[device] if device.type == "cuda" else None,
            find_unused_parameters=routed, **no_buffer_sync)  # an expert may get no token
    runnable = parallel if parallel is not None else model
    return parallel, torch.compile(runnable) if compile_model else runnable


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@torch.no_grad()
def evaluate_model(model: nn.Module, task: Task, batch: Batch,
                   precision: AbstractContextManager = nullcontext(),
                   exact_match: bool = True) -> dict[str, float]:
    """Loss, token accuracy and (where the task has it, if ``exact_match``) exact match of
    ``model`` in eval mode on ``batch``, under ``precision`` (e.g. bf16 autocast); the model's
    train/eval mode is restored."""
    was_training = model.training
    model.eval()
    with precision:
        logits = model(batch.inputs)  # (B, T, V)
        match = task.exact_match(model, batch) if exact_match else None
    model.train(was_training)
    return {"loss": sequence_loss(logits, batch.targets).item(),
            "accuracy": token_accuracy(logits, batch.targets),
            "exact_match": math.nan if match is None else match}


@dataclass
class TrainResult:
    steps: int = 0
    final_loss: float = math.nan  # last held-out loss (fit always evaluates at its last step)
    best_exact_match: float | None = None
    solved_step: int | None = None  # first step whose held-out exact match reached the target
    wall_s: float = 0.0  # of the fit call that made this result
    tokens_per_s: float = 0.0  # tokens of the fit call over its wall time
    first_step_s: float = math.nan  # the fit call's first step (compilation, warm-up)
    step_ms: float = math.nan  # a step after the first, evaluations and checkpoints left out
    steady_tokens_per_s: float = math.nan  # tokens per step over step_ms
    train_losses: list[float] = field(default_factory=list)  # one per logged step
    grad_norms: list[float] = field(default_factory=list)


class Trainer:
    """Owns the optimisers, the data generator and the step counter for one model on one
    task."""

    def __init__(self, model: nn.Module, task: Task, settings: TrainSettings, seed: int,
                 metrics: CsvLog | None = None) -> None:
        self.model = model
        self.task = task
        self.settings = settings
        self.metrics = metrics
        self.device = distributed.resolve_device(settings.device)
        model.to(self.device)  # in place (same Parameter objects); a no-op on CPU
        self.ranks, self.rank = (torch.distributed.get_world_size(),
                                 torch.distributed.get_rank()) if distributed.joined() else (1, 0)
        if settings.batch_size * settings.grad_accum < self.ranks:
            raise ConfigError(f"train.batch_size={settings.batch_size} x train.grad_accum="
                              f"{settings.grad_accum} is less than one sequence for each of "
                              f"the {self.ranks} processes; raise train.batch_size")
        self.parallel, self.runnable = runnable_model(model, self.device, settings.compile)
        self.generator = torch.Generator().manual_seed(int(seed))
        self.schedule = SCHEDULES[settings.schedule]
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._horizon = settings.steps  # the schedule's total steps; each fit sets it
        self.optimizers: OptimizerSet = build_optimizers(
            model, settings.optimizer, self.schedule(1, settings, self._horizon))
        self.max_grad_norm = settings.grad_clip if settings.grad_clip else math.inf
        self.autocast: AbstractContextManager = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if settings.precision == "bf16" else nullcontext())
        self.step_count = 0
        self.started = time.perf_counter()

    def synchronized_clock(self) -> float:
        """``time.perf_counter()`` once the device has done the work queued so far."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def plan_schedule(self, steps: int) -> None:
        """The schedule ends ``steps`` steps from now (its ``total_steps``: the length of this
        training, whichever routine setting gave it)."""
        self._horizon = self.step_count + int(steps)

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step; returns (loss, grad_norm) as tensors (no host sync) and the lr."""
        self.step_count += 1
        lr = self.schedule(self.step_count, self.settings, self._horizon)
        self.optimizers.set_lr(lr)
        if not self.model.training:
            self.runnable.train()
        parts = self.micro_batches(batch)
        self.optimizers.zero_grad()
        step_loss = None
        for index, (micro, share) in enumerate(parts):
            synced = self.parallel is None or index == len(parts) - 1  # DDP: the last backward
            with nullcontext() if synced else self.parallel.no_sync():
                with self.autocast:
                    loss = sequence_loss(self.runnable(micro.inputs), micro.targets)
                    auxiliary = model_auxiliary_loss(self.model)  # MoE load balancing, or None
                objective = loss if auxiliary is None else loss + auxiliary
                scaled(objective, share * self.ranks).backward()  # DDP averages over ranks
            part = scaled(loss.detach(), share)
            step_loss = part if step_loss is None else step_loss + part
        step_loss = distributed.all_reduce_sum(step_loss)  # the global batch's mean
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        self.optimizers.step()
        return step_loss, grad_norm, lr

    def micro_batches(self, batch: Batch) -> list[tuple[Batch, float]]:
        """This rank's part of the global ``batch`` as micro-batches on the device, each with
        its share of the global batch's scored tokens (the weight of its mean loss)."""
        if self.ranks == 1 and self.settings.grad_accum == 1:
            return [(batch.to(self.device), 1.0)]
        scored = batch.targets != IGNORE_INDEX  # (B, T)
        total = max(int(scored.sum()), 1)
        rows = torch.tensor_split(torch.arange(batch.inputs.shape[0]), self.ranks)[self.rank]
        count = -(-self.settings.grad_accum // self.ranks)  # micro-batches on each rank
        return [(Batch(batch.inputs[part], batch.targets[part]).to(self.device),
                 int(scored[part].sum()) / total)
                for part in torch.tensor_split(rows, count) if len(part)]

    def state_dict(self) -> dict[str, Any]:
        """What a stopped training needs to go on exactly: the model's weights, the optimisers'
        states, the step and the schedule's horizon, torch's global random state (dropout, a
        router's noise) and the data generator's (the next batches); CUDA's where training runs
        there."""
        state = {"model": self.model.state_dict(), "step": self.step_count,
                 "horizon": self._horizon,
                 "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
                 "torch_rng": torch.get_rng_state(), "data_rng": self.generator.get_state()}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Go on from ``state_dict()``'s state (a trainer built like the one that saved it)."""
        self.model.load_state_dict(state["model"])
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            optimizer.load_state_dict(saved)
        self.step_count, self._horizon = int(state["step"]), int(state["horizon"])
        self.generator.set_state(state["data_rng"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)

    def evaluate(self, batch: Batch | None = None, exact_match: bool = True) -> dict[str, float]:
        """``evaluate_model`` on ``batch`` (default: the task's held-out batch), in the precision
        of training."""
        batch = (batch or self.task.eval_batch()).to(self.device)
        return evaluate_model(self.model, self.task, batch, self.autocast, exact_match)

    def log(self, row: dict) -> None:
        row["elapsed_s"] = time.perf_counter() - self.started
        if self.metrics is not None:
            self.metrics.write(row)

    def record_train(self, result: TrainResult, step: int, loss: float, grad_norm: float,
                     lr: float, tokens_per_s: float,
                     on_step: Callable[[int, float], None] | None = None) -> None:
        """A ``train`` row into the metrics and ``result``; ``Diverged`` (after the row is
        written) when the loss or gradient norm is not finite."""
        result.train_losses.append(loss)
        result.grad_norms.append(grad_norm)
        self.log({"step": step, "split": "train", "loss": loss, "lr": lr,
                  "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                  **model_auxiliary_metrics(self.model)})
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise Diverged(f"loss became {loss} at step {step} (lr={lr:.3g})")
        if on_step is not None:
            on_step(step, loss)

    def record_eval(self, result: TrainResult, step: int, lr: float,
                    target_exact_match: float | None) -> bool:
        """Held-out evaluation: a ``val`` row into the metrics and ``result``; True when exact
        match reached ``target_exact_match`` (solved at ``step``)."""
        evaluation = self.evaluate()
        self.log({"step": step, "split": "val", **evaluation, "lr": lr})
        result.final_loss = evaluation["loss"]
        match = evaluation["exact_match"]
        if not math.isnan(match):
            result.best_exact_match = max(result.best_exact_match or 0.0, match)
            if target_exact_match is not None and match >= target_exact_match:
                result.solved_step = step
                return True
        return False

    def fit(self, steps: int, *, batches: Sequence[Batch] | None = None,
            target_exact_match: float | None = None,
            on_step: Callable[[int, float], None] | None = None,
            horizon: int | None = None,
            on_checkpoint: Callable[[TrainResult], None] | None = None,
            result: TrainResult | None = None) -> TrainResult:
        """Train for ``steps`` steps (fresh batches, or cycle through fixed ``batches``).

        With ``target_exact_match`` training stops at the first evaluation that reaches it.
        ``on_step(step, loss)`` is called at every logged step. ``horizon``: the number of
        steps the schedule plans for (``warmup_cosine`` reaches its floor there; default
        ``steps``), e.g. a routine's step budget when it may stop early.
        ``on_checkpoint(result)`` is called every ``checkpoint_every`` steps, after the step's
        rows, and before ``Interrupted`` is raised (``stop_between_steps``); ``result``: the
        result of the fit this one continues (a resumed training).
        """
        self.plan_schedule(steps if horizon is None else horizon)
        result = TrainResult() if result is None else result
        log_every, eval_every = max(1, self.settings.log_every), self.settings.eval_every
        checkpoint_every = self.settings.checkpoint_every
        tokens_since, total_tokens, first_tokens, taken, paused = 0, 0, 0, 0, 0.0
        started = clock = time.perf_counter()
        for i in range(steps):
            if STOP.signum is not None:  # SIGINT/SIGTERM under stop_between_steps: the state
                result.steps = self.step_count  # is whole here; the caller keeps it
                if on_checkpoint is not None:
                    on_checkpoint(result)
                raise Interrupted(f"stopped by {signal.Signals(STOP.signum).name} at step "
                                  f"{self.step_count}", STOP.signum, self.step_count)
            if batches is not None:
                batch = batches[i % len(batches)]
            else:  # the global batch (train_step takes this rank's micro-batches from it)
                batch = self.task.train_batch(self.settings.batch_size * self.settings.grad_accum,
                                              self.generator)
            loss, grad_norm, lr = self.train_step(batch)
            taken += 1
            if i == 0:  # the first step is done (compilation, warm-up): the steady clock starts
                loss.item()
                result.first_step_s = time.perf_counter() - started
                first_tokens = batch.inputs.numel()
            tokens_since += batch.inputs.numel()
            total_tokens += batch.inputs.numel()
            step, last = self.step_count, i == steps - 1
            if step % log_every == 0 or last:
                now = time.perf_counter()
                self.record_train(result, step, loss.item(), grad_norm.item(), lr,
                                  tokens_since / max(now - clock, 1e-9), on_step)
                tokens_since, clock = 0, now
            evaluating = (eval_every and step % eval_every == 0) or last
            checkpointing = bool(on_checkpoint is not None and checkpoint_every
                                 and step % checkpoint_every == 0)
            pause_start = self.synchronized_clock() if evaluating or checkpointing else None
            solved = bool(evaluating) and self.record_eval(result, step, lr, target_exact_match)
            if checkpointing and not solved:
                result.steps = step
                on_checkpoint(result)
            if pause_start is not None:
                paused += time.perf_counter() - pause_start
            if solved:
                break
        result.steps = self.step_count
        result.wall_s = self.synchronized_clock() - started  # this call's, not since construction
        result.tokens_per_s = total_tokens / max(result.wall_s, 1e-9)
        steady_s = result.wall_s - result.first_step_s - paused
        if taken > 1 and steady_s > 0:
            result.step_ms = 1e3 * steady_s / (taken - 1)
            result.steady_tokens_per_s = (total_tokens - first_tokens) / steady_s
        return result


# --- stopping between steps ------------------------------------------------------------------

class _StopRequest:
    signum: int | None = None  # the signal that asked training to stop, while one is pending


STOP = _StopRequest()


@contextmanager
def stop_between_steps() -> Iterator[None]:
    """While the block runs (in the main thread), SIGINT (Ctrl-C) and SIGTERM (SLURM, ``timeout``)
    ask training to stop: ``Trainer.fit`` hands its state to ``on_checkpoint`` before its next
    step and raises ``Interrupted`` (exit 130 or 143). A second signal raises at once. A signal
    that comes after the last step is ignored: the run has finished. A signal the process
    ignores (a shell's background job ignores SIGINT) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request(signum: int, frame: object) -> None:
        if STOP.signum is not None:  # asked twice: stop now, wherever training is
            raise Interrupted(f"stopped by {signal.Signals(signum).name} (a second signal: "
                              "not at the end of a step, no state kept)", signum)
        STOP.signum = signum

    before = {signum: signal.signal(signum, request) for signum in (signal.SIGINT, signal.SIGTERM)
              if signal.getsignal(signum) is not signal.SIG_IGN}  # ignored stays ignored
    try:
        yield
    finally:
        STOP.signum = None
        for signum, handler in before.items():
            signal.signal(signum, handler)
