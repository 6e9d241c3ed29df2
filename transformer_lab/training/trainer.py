"""The training loop: AdamW, gradient clipping, a schedule from ``schedules.SCHEDULES``,
periodic held-out evaluation, and metrics rows written as it goes.

Deterministic on CPU: the caller seeds torch before building the model; batches are drawn from
a ``torch.Generator`` seeded with ``seed``, so the same config gives the same numbers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from transformer_lab.errors import Diverged
from transformer_lab.results.run_directory import CsvLog
from transformer_lab.tasks import IGNORE_INDEX, Batch, Task
from transformer_lab.training.compile import CompileProbe, ModelLoss
from transformer_lab.training.lockstep import Lockstep
from transformer_lab.training.optim import (
    adamw_param_groups,
    clip_gradients,
    make_adamw,
    set_lr,
)
from transformer_lab.training.schedules import SCHEDULES


def sequence_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over scored positions: logits (B, T, V), targets (B, T). The cast to
    fp32 (a no-op for fp32 logits) is what autocast does for cross-entropy, made explicit: under
    vmap on CUDA autocast's fp32 casts were seen to be skipped (for the attention softmax)."""
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


class PlainConfig(SimpleNamespace):
    """A read-only snapshot of a config node with plain attributes: reading a DictConfig value
    costs microseconds, too much for a per-step schedule call on a tiny model."""

    def __init__(self, node: DictConfig | dict) -> None:
        values = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) \
            else dict(node)
        super().__init__(**values)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key, default)

    def __getitem__(self, key: str) -> object:
        return getattr(self, key)


@dataclass
class TrainResult:
    steps: int = 0
    final_loss: float = math.nan  # last held-out loss (fit always evaluates at its last step)
    best_exact_match: float | None = None
    solved_step: int | None = None  # first step whose held-out exact match reached the target
    wall_s: float = 0.0  # of the fit call that made this result
    tokens_per_s: float = 0.0
    train_losses: list[float] = field(default_factory=list)  # one per logged step
    grad_norms: list[float] = field(default_factory=list)


class Trainer:
    """Owns the optimiser and the step counter for one model on one task."""

    def __init__(self, model: nn.Module, task: Task, train: DictConfig, d_model: int,
                 seed: int, metrics: CsvLog | None = None) -> None:
        if train.schedule not in SCHEDULES:
            raise ValueError(f"train.schedule='{train.schedule}' is not known; valid: "
                             f"{', '.join(SCHEDULES)}")
        self.model = model
        self.task = task
        self.cfg = train
        self.d_model = d_model
        self.metrics = metrics
        self.device = torch.device(train.device)
        model.to(self.device)  # in place (same Parameter objects); a no-op on CPU
        self.generator = torch.Generator().manual_seed(seed)
        self.schedule = SCHEDULES[train.schedule]
        self._train = PlainConfig(train)  # hot-path copy of the train settings
        self._params = [p for p in model.parameters() if p.requires_grad]
        groups = adamw_param_groups(self._params, float(train.weight_decay))
        self._horizon = int(train.steps)  # the schedule's total steps; each fit sets it
        lr = self.schedule(1, self._train, d_model, self._horizon)
        self.optimizer = make_adamw(groups, lr, tuple(train.betas))
        self._grad_clip = float(train.grad_clip) if train.grad_clip else math.inf
        self.autocast = (
            torch.autocast(self.device.type, dtype=torch.bfloat16)
            if train.precision == "bf16" else nullcontext()
        )
        self.step_count = 0
        self.started = time.perf_counter()
        # (inputs, targets) -> loss: the forward and the loss, compiled together (compile.py)
        self._loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._eager_loss

    @property
    def _lr(self) -> float:
        """The learning rate the last step used (the optimiser's)."""
        return self.optimizer.param_groups[0]["lr"]

    def plan_schedule(self, steps: int) -> None:
        """The schedule ends ``steps`` steps from now (its ``total_steps``: the length of this
        training, whichever routine setting gave it)."""
        self._horizon = self.step_count + int(steps)

    def train_step(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimiser step; returns (loss, grad_norm) as tensors (no host sync) and the lr."""
        self.step_count += 1
        lr = self.schedule(self.step_count, self._train, self.d_model, self._horizon)
        set_lr(self.optimizer, lr)
        if not self.model.training:
            self.model.train()
        with self.autocast:
            loss = self._loss(batch.inputs, batch.targets)
            auxiliary = model_auxiliary_loss(self.model)  # e.g. MoE load balancing, or None
        for param in self._params:  # zero_grad(set_to_none=True) without its hooks
            param.grad = None
        (loss if auxiliary is None else loss + auxiliary).backward()
        grad_norm = clip_gradients(self._params, self._grad_clip)
        self.optimizer.step()
        return loss.detach(), grad_norm, lr

    def _eager_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return sequence_loss(self.model(inputs), targets)

    def step_work(self) -> int:
        """Tokens per step x d_model: what decides whether a compile can pay on a CPU."""
        return int(self._train.batch_size) * int(self.task.model_seq_len) * int(self.d_model)

    def compile_probe(self, steps: int) -> CompileProbe | None:
        """With ``train.compile=true``, what compiles the training forward where it pays
        (``training/compile.py``); None otherwise."""
        if not self._train.get("compile"):
            return None
        return CompileProbe(ModelLoss(self.model, sequence_loss), steps, self.step_work(),
                            str(self.device), "the training step",
                            lambda loss: setattr(self, "_loss", loss))

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
                     on_step: Callable[[int, float], None] | None = None,
                     who: str = "") -> None:
        """A ``train`` row into the metrics and ``result``; ``Diverged`` (after the row is
        written) when the loss or gradient norm is not finite. ``who`` prefixes the message."""
        result.train_losses.append(loss)
        result.grad_norms.append(grad_norm)
        self.log({"step": step, "split": "train", "loss": loss, "lr": lr,
                  "grad_norm": grad_norm, "tokens_per_s": tokens_per_s,
                  **model_auxiliary_metrics(self.model)})
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            raise Diverged(f"{who}loss became {loss} at step {step} (lr={lr:.3g})")
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
            lead: Lockstep | None = None, follow: Lockstep | None = None,
            horizon: int | None = None) -> TrainResult:
        """Train for ``steps`` steps (fresh batches, or cycle through fixed ``batches``).

        Every ``train.log_every`` steps a ``train`` row is logged (loss, lr, grad norm,
        tokens/s) and the loss is checked: NaN/inf raises ``Diverged`` after the row is written.
        Every ``train.eval_every`` steps (and at the end) a ``val`` row is logged; with
        ``target_exact_match`` training stops at the first evaluation that reaches it.
        ``lead`` / ``follow``: this run leads, or follows on another thread, a ``Lockstep``
        (a follower stops after the leader's last step, as if that were its ``steps``).
        ``horizon``: the number of steps the schedule plans for (``warmup_cosine`` reaches its
        floor there; default ``steps``), e.g. a routine's step budget when it may stop early.
        """
        self.plan_schedule(steps if horizon is None else horizon)
        try:
            return self._fit(steps, batches, target_exact_match, on_step, follow, lead)
        finally:
            if lead is not None:  # also on an error: the follower must not wait for more
                lead.stopped(self.step_count)

    def _fit(self, steps: int, batches: Sequence[Batch] | None, target_exact_match: float | None,
             on_step: Callable[[int, float], None] | None, follow: Lockstep | None = None,
             lead: Lockstep | None = None) -> TrainResult:
        result = TrainResult()
        log_every, eval_every = max(1, self.cfg.log_every), self.cfg.eval_every
        tokens_since, total_tokens = 0, 0
        probe = self.compile_probe(steps)  # train.compile=true: compile if it pays, or None
        started = clock = time.perf_counter()
        for i in range(steps):
            if i == 0 and follow is not None and not follow.may_take(self.step_count + 1):
                break  # the leader took no steps at all (later steps: ``last`` below)
            if batches is not None:
                batch = batches[i % len(batches)]
            else:
                batch = self.task.train_batch(self._train.batch_size, self.generator)
            batch = batch.to(self.device)
            loss, grad_norm, lr = self.train_step(batch)
            tokens_since += batch.inputs.numel()
            total_tokens += batch.inputs.numel()
            if probe is not None:
                probe.after_step(i)
            step = self.step_count
            if lead is not None:
                lead.took(step)
            last = i == steps - 1 or (follow is not None and not follow.may_take(step + 1))
            if step % log_every == 0 or last:
                now = time.perf_counter()
                self.record_train(result, step, loss.item(), grad_norm.item(), lr,
                                  tokens_since / max(now - clock, 1e-9), on_step)
                tokens_since, clock = 0, now
            evaluating = (eval_every and step % eval_every == 0) or last
            if evaluating and self.record_eval(result, step, lr, target_exact_match):
                break  # solved
            if last:
                break
        result.steps = self.step_count
        result.wall_s = time.perf_counter() - started  # this call's, not since construction
        result.tokens_per_s = total_tokens / max(result.wall_s, 1e-9)
        return result
