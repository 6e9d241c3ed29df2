"""The training loop: one model on one task (``Trainer.fit``). The step, gradient accumulation, DDP
and the resumable state are described in docs/scale.md."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from inspect import signature
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.config.spec import TrainSettings
from transformer_lab.errors import ConfigError, Diverged, Interrupted
from transformer_lab.results.run_directory import CsvLog
from transformer_lab.tasks import IGNORE_INDEX, Batch, Task
from transformer_lab.training import distributed
from transformer_lab.training.optimizers import build_optimizers
from transformer_lab.training.schedules import schedule


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over scored positions, in fp32: logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX)


def last_forward(model: nn.Module, name: str, default: Any) -> Any:
    """``model.<name>()`` about its last forward where the model has it (MoE's ``auxiliary_loss``,
    ``auxiliary_metrics``: extra ``metrics.csv`` columns), else ``default``."""
    collect = getattr(model, name, None)
    return collect() if callable(collect) else default


def runnable_model(model: nn.Module, device: torch.device, compile_model: bool
                   ) -> tuple[nn.Module | None, nn.Module]:
    """``(DDP wrapper or None, what a step calls)``: ``model`` under DDP when this process is one of
    several, then ``torch.compile`` when asked; the parameters stay ``model``'s."""
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
    """Loss, token accuracy and exact match (NaN where the task has none) in eval mode, under
    ``precision``; the train/eval mode is restored."""
    was_training = model.training
    model.eval()
    with precision:
        logits = model(batch.inputs)  # (B, T, V)
        match = task.exact_match(model, batch) if exact_match else None
    model.train(was_training)
    scored = batch.targets != IGNORE_INDEX
    return {"loss": sequence_loss(logits, batch.targets).item(),
            "accuracy": (logits.argmax(dim=-1) == batch.targets)[scored].float().mean().item(),
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


def scaled(value: torch.Tensor, factor: float) -> torch.Tensor:
    """``value * factor``; ``value`` itself for a factor of 1 (no extra op in the step's graph)."""
    return value if factor == 1.0 else value * factor


class Trainer:
    """The optimisers, data generator and step counter of one model on one task."""

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
        self.schedule = schedule(settings.schedule)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._horizon = settings.steps  # the schedule's total steps; each fit sets it
        self.optimizers, self.lr_ratios = build_optimizers(
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

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step; returns (loss, grad_norm) as tensors (no host sync) and the lr."""
        self.step_count += 1
        lr = self.schedule(self.step_count, self.settings, self._horizon)
        for optimizer, ratio in zip(self.optimizers, self.lr_ratios, strict=True):
            for group in optimizer.param_groups:
                group["lr"] = lr * ratio
        for optimizer in self.optimizers:
            optimizer.zero_grad()
        if not self.model.training:
            self.runnable.train()
        parts = self.micro_batches(batch)
        step_loss = None
        for index, (micro, share) in enumerate(parts):
            synced = self.parallel is None or index == len(parts) - 1  # DDP: the last backward
            with nullcontext() if synced else self.parallel.no_sync():
                with self.autocast:
                    loss = sequence_loss(self.runnable(micro.inputs), micro.targets)
                    auxiliary = last_forward(self.model, "auxiliary_loss", None)  # MoE, or None
                objective = loss if auxiliary is None else loss + auxiliary
                scaled(objective, share * self.ranks).backward()  # DDP averages over ranks
            part = scaled(loss.detach(), share)
            step_loss = part if step_loss is None else step_loss + part
        step_loss = distributed.all_reduce_sum(step_loss)  # the global batch's mean
        grad_norm = torch.nn.utils.clip_grad_norm_(self._params, self.max_grad_norm)
        for optimizer in self.optimizers:
            optimizer.step()
        return step_loss, grad_norm, lr

    def micro_batches(self, batch: Batch) -> list[tuple[Batch, float]]:
        """This rank's micro-batches of the global ``batch`` on the device, each with its share of
        the scored tokens (the weight of its mean loss)."""
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
        """Weights, optimiser states, step, schedule horizon, torch's (and CUDA's) and the data
        generator's random states: enough to go on exactly."""
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
        """``evaluate_model`` on ``batch`` (default: the held-out one) in training's precision."""
        batch = (batch or self.task.eval_batch()).to(self.device)
        return evaluate_model(self.model, self.task, batch, self.autocast, exact_match)

    def log(self, row: dict) -> None:
        row["elapsed_s"] = time.perf_counter() - self.started
        if self.metrics is not None:
            self.metrics.write(row)

    def fit(self, steps: int, *, batches: Sequence[Batch] | None = None,
            target_exact_match: float | None = None,
            on_step: Callable[[int, float], None] | None = None,
            horizon: int | None = None,
            on_checkpoint: Callable[[TrainResult], None] | None = None,
            result: TrainResult | None = None) -> TrainResult:
        """Train ``steps`` steps (fresh batches, or cycling ``batches``) up to the first held-out
        exact match >= ``target_exact_match``; ``horizon``: the schedule's (default ``steps``);
        ``on_step(step, loss)`` at each train row; ``on_checkpoint(result)`` every
        ``checkpoint_every`` steps and before ``Interrupted``; ``result``: the fit it resumes."""
        self._horizon = self.step_count + int(steps if horizon is None else horizon)
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
            taken, tokens = taken + 1, batch.inputs.numel()
            if i == 0:  # the first step is done (compilation, warm-up): the steady clock starts
                loss.item()
                result.first_step_s = time.perf_counter() - started
                first_tokens = tokens
            tokens_since, total_tokens = tokens_since + tokens, total_tokens + tokens
            step, last = self.step_count, i == steps - 1
            if step % log_every == 0 or last:  # a train row; Diverged when it is not finite
                now = time.perf_counter()
                train_loss, norm = loss.item(), grad_norm.item()
                result.train_losses.append(train_loss)
                result.grad_norms.append(norm)
                self.log({"step": step, "split": "train", "loss": train_loss, "lr": lr,
                          "grad_norm": norm, "tokens_per_s": tokens_since / max(now - clock, 1e-9),
                          **last_forward(self.model, "auxiliary_metrics", {})})
                if not (math.isfinite(train_loss) and math.isfinite(norm)):
                    raise Diverged(f"loss became {train_loss} at step {step} (lr={lr:.3g})")
                if on_step is not None:
                    on_step(step, train_loss)
                tokens_since, clock = 0, now
            evaluating = (eval_every and step % eval_every == 0) or last
            checkpointing = bool(on_checkpoint is not None and checkpoint_every
                                 and step % checkpoint_every == 0)
            pause_start = self.synchronized_clock() if evaluating or checkpointing else None
            solved = False
            if evaluating:  # a held-out val row
                evaluation = self.evaluate()
                self.log({"step": step, "split": "val", **evaluation, "lr": lr})
                result.final_loss, match = evaluation["loss"], evaluation["exact_match"]
                if not math.isnan(match):
                    result.best_exact_match = max(result.best_exact_match or 0.0, match)
                    solved = target_exact_match is not None and match >= target_exact_match
                    if solved:
                        result.solved_step = step
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

STOP = SimpleNamespace(signum=None)  # the signal that asked training to stop, while one is pending


@contextmanager
def stop_between_steps() -> Iterator[None]:
    """In the block (main thread only), SIGINT and SIGTERM stop ``Trainer.fit`` after the current
    step (``on_checkpoint``, then ``Interrupted``); a second signal raises at once, and a signal the
    process ignores stays ignored."""
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
