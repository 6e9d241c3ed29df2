"""``train.compile=true``: ``torch.compile`` of the training step's forward and loss (their
backward too, through AOTAutograd), used only where it pays.

What is compiled (``compile_step``): a ``ModelLoss`` (the model and its loss in one graph) with
one shared Inductor backend (``_inductor_backend``: on CPU the ``UnfusedBias`` pass and
``cpp_wrapper``). The forward traces as one graph (no graph break: attention reads no
``ContextVar`` there, the PEs skip their value checks, the model its inference-mode check;
``ffn=moe`` still breaks at its routing's data-dependent shapes; dynamic RoPE scaling at its
length check), and on CPU attention is written out (two batched matmuls and a softmax that
Inductor fuses) instead of SDPA's CPU kernel.

Measured on the ``small`` step (d 64, 2 layers, 64 x 16 tokens, fp32, one thread, the 2-core
CPU; ``benchmarks/multiseed.py --sizes small --seeds 1 --compile`` with its compiled arm set as
``Trainer.compile_probe`` sets it, and same-process A/B scripts with the benchmark's
definitions, medians of 3-5; % of the 512^3 matmul peak measured in the same run, 196-218
GFLOP/s): eager 8.4-9.2 ms (31-35%); compiled 6.6-6.9 ms (40.6-42.2%; 0.77-0.82x eager); the
benchmark's rows kept in ``benchmarks/multiseed.csv``: eager 8.7-9.0 ms (31.7-32.7%), compiled
7.0-7.3 ms (39.3-40.7%; 0.80-0.82x). Each
change's share, one at a time from the compiled forward with graph breaks (26-28%): no graph
break ~37.5%; written-out attention -5% of the step; the loss in the graph -0.2 to -0.6 ms;
``UnfusedBias`` -0.3 ms; ``cpp_wrapper`` -0.2 ms. Tried and left out: ``max_autotune`` (C++
GEMM templates win only the 16x16x16 attention matmuls: -0.03 ms, +~9 s of compile);
``memory_planning``, ``cpp.simdlen=256`` (slower), glibc malloc thresholds (page faults:
~270 a step eager, ~30 compiled; -0.05 ms). What is left: the matmuls (3.8 ms of the step;
3.1 ms timed alone) and Inductor's erf-based GELU kernels (~1.4 ms forward and backward).

A compile costs ``COMPILE_SECONDS`` (16.3-16.9 s for ``small`` from an empty Inductor cache,
1.5-2 s with a warm one) and saves a share of each step (``EXPECTED_SAVING``, the ``small``
saving; elsewhere it is checked). So a run (``CompileProbe``) first times ``PROBE_STEPS`` eager
steps and compiles only if ``steps left x step time x EXPECTED_SAVING > COMPILE_SECONDS``,
never for an overhead-bound CPU step (tokens x d_model <= ``OVERHEAD_BOUND_WORK``: compiled,
the ``tiny`` step now runs 0.63-0.8 ms against 0.9-1.0 eager, but ~0.3 ms a step repays a
compile only after ~60k steps, and its 4-step timing windows are too noisy to judge); then it
times as many compiled steps and keeps whichever ran faster. Each decision is printed (skipped
and why; the compile time; compiled vs eager ms/step, kept or back to eager; a failed compile
and why, then eager). Evaluation and generation stay eager (their shapes vary: each would
compile again). A compiled step rounds differently from an eager one (fused kernels).

``compile_unavailable()`` says why torch.compile cannot run here (on CPU Inductor needs a C++
compiler); ``check_compile`` turns ``train.compile=true`` there into a ``ConfigError`` (exit 2).
"""

from __future__ import annotations

import functools
import os
import shutil
import time
from collections.abc import Callable

import torch
from torch import nn

from transformer_lab.errors import ConfigError

PROBE_STEPS = (2, 6)  # eager steps timed before deciding: [2, 6) (the first ones warm up)
COMPILE_SECONDS = 20.0  # one compile of the training step, 2-core CPU, empty cache (~17 s)
EXPECTED_SAVING = 0.2  # the share of a step a compile saves (small: 18-23%; it is checked)
OVERHEAD_BOUND_WORK = 8192  # tokens x d_model at or below which a CPU step is overhead-bound

Forward = Callable[..., torch.Tensor]  # inputs -> logits, or (inputs, targets) -> loss


def _clock(device: str) -> float:
    """``time.perf_counter()`` once the device's queued work is done (CUDA runs ahead of the
    host: without the wait a window would time kernel launches, not steps)."""
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter()


def compile_unavailable() -> str | None:
    """None if ``torch.compile`` can build kernels here, else why not (in words)."""
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    compilers = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in compilers):
        return "torch.compile on CPU needs a C++ compiler (g++, c++ or clang++; none on PATH)"
    return None


def check_compile(value: object, device: str) -> None:
    """``ConfigError`` unless ``train.compile`` is a bool that can be honoured here."""
    if not isinstance(value, bool):
        raise ConfigError(f"train.compile={value} is not valid; use true or false")
    if value and not str(device).startswith("cuda"):
        reason = compile_unavailable()
        if reason is not None:
            raise ConfigError(f"train.compile=true cannot run here: {reason}; use "
                              "train.compile=false")


def pays(step_s: float, steps_left: int, work: int, device: str) -> tuple[bool, str]:
    """Whether compiling pays for ``steps_left`` more steps of ``step_s`` seconds each, and why
    (in words). ``work``: tokens per step x d_model of one seed."""
    if not str(device).startswith("cuda") and work <= OVERHEAD_BOUND_WORK:
        return False, (f"an overhead-bound step on CPU (tokens x d_model = {work} <= "
                       f"{OVERHEAD_BOUND_WORK}) saves too little to repay a compile")
    saving = steps_left * step_s * EXPECTED_SAVING
    if saving <= COMPILE_SECONDS:
        return False, (f"{steps_left} steps of {step_s * 1e3:.1f} ms would save at most "
                       f"~{saving:.0f} s against ~{COMPILE_SECONDS:.0f} s of compiling")
    return True, f"{steps_left} steps of {step_s * 1e3:.1f} ms: up to ~{saving:.0f} s saved"


class ModelLoss(nn.Module):
    """``loss(model(inputs), targets)`` as one module: what a training step compiles, so that
    the loss (log-softmax, cross-entropy) fuses with the forward in one graph and AOTAutograd
    derives the backward of both (on the ``small`` CPU step: ~0.2-0.6 ms of ~7 saved)."""

    def __init__(self, model: nn.Module, loss: Callable[[torch.Tensor, torch.Tensor],
                                                        torch.Tensor]) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(inputs), targets)


@functools.cache
def _inductor_backend(cuda: bool) -> object:
    """The Inductor backend of every training-step compile, one per device kind: on CPU the
    ``UnfusedBias`` pass and ``cpp_wrapper`` (the step's kernel calls from C++, not Python);
    Inductor's defaults on CUDA (not measured here). One object, shared: Dynamo guards on the
    backend, so a new one per ``torch.compile`` recompiled the same graph for each model (each
    seed of a run) until its recompile limit (8) left the rest eager."""
    options: dict[str, object] = {}
    if not cuda:
        from transformer_lab.training.inductor_passes import UnfusedBias  # imports Inductor: 0.7 s

        options = {"post_grad_custom_post_pass": UnfusedBias(), "cpp_wrapper": True}
    return torch._TorchCompileInductorWrapper(None, options, False)


def compile_step(module: nn.Module, device: str) -> Forward:
    """``torch.compile`` of a training forward (a ``ModelLoss``, or a model) for ``device``:
    static shapes, ``_inductor_backend``; models of the same class and shapes share one graph."""
    backend = _inductor_backend(str(device).startswith("cuda"))
    return torch.compile(module, dynamic=False, backend=backend)


class TimedFirstCall:
    """``forward`` whose first call (the compile) is timed and reported. If that call fails
    (Inductor could not build a kernel) it says why and runs ``eager`` instead, from then on
    (``failed``): the eager steps before it ran the same shapes, so the error is the compile's."""

    def __init__(self, forward: Forward, eager: Forward, label: str,
                 report: Callable[[str], None]) -> None:
        self.forward, self.eager, self.label, self.report = forward, eager, label, report
        self.seconds: float | None = None
        self.failed = False

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if self.seconds is not None:
            return self.forward(*args)
        start = time.perf_counter()
        try:
            out = self.forward(*args)
        except Exception as error:  # any compile failure: eager from then on
            self.seconds, self.failed, self.forward = time.perf_counter() - start, True, self.eager
            reason = (str(error).strip().splitlines() or [""])[0][:200]
            self.report(f"train.compile: compiling {self.label} failed "
                        f"({type(error).__name__}: {reason}); eager")
            return self.eager(*args)
        self.seconds = time.perf_counter() - start
        self.report(f"train.compile: compiled {self.label} in {self.seconds:.1f} s")
        return out


class CompileProbe:
    """Times ``PROBE_STEPS`` eager steps of a training loop; if a compile may pay (``pays``),
    installs ``compile_step(model)`` (``install``; ``model``: the model, or better its
    ``ModelLoss``), times as many compiled steps after the compile and keeps whichever ran
    faster, saying so. Call ``after_step(i)`` after the loop's step i (0-based) of ``steps``."""

    def __init__(self, model: nn.Module, steps: int, work: int, device: str, label: str,
                 install: Callable[[Forward], None],
                 report: Callable[[str], None] | None = None) -> None:
        self.model, self.steps, self.work, self.device, self.label = (model, steps, work,
                                                                      device, label)
        self.install = install
        self.compiled: TimedFirstCall | None = None
        self.report = report or _console_print
        self.eager_s: float | None = None  # seconds per eager step, once timed
        self.compiled_s: float | None = None
        self.started: float | None = None
        self.compiled_from: int | None = None  # the loop step whose forward compiled
        first, last = PROBE_STEPS
        self.done = steps < 2 * last
        if self.done:
            self.report(f"train.compile: skipped for {label} ({steps} steps are too few to "
                        "time the step eager and compiled)")

    def after_step(self, i: int) -> None:
        if self.done:
            return
        first, last = PROBE_STEPS
        if self.compiled_from is None:
            self._probe_eager(i + 1, first, last)
            return
        n = i - self.compiled_from  # compiled steps taken since the compile
        if self.compiled.failed:  # eager again, said so
            self.done = True
        elif n == first - 1:
            self.started = _clock(self.device)
        elif n == last - 1:
            self.done = True
            self.compiled_s = (_clock(self.device) - self.started) / (last - first)
            faster = self.compiled_s < self.eager_s
            words = (f"{self.compiled_s * 1e3:.1f} ms/step compiled against "
                     f"{self.eager_s * 1e3:.1f} eager")
            if not faster:
                self.install(self.model)
            self.report(f"train.compile: {words}: {'kept' if faster else 'back to eager'}")

    def _probe_eager(self, taken: int, first: int, last: int) -> None:
        """After ``taken`` eager steps: start the clock, or decide whether to compile."""
        if taken == first:
            self.started = _clock(self.device)
        elif taken == last:
            self.eager_s = (_clock(self.device) - self.started) / (last - first)
            use, why = pays(self.eager_s, self.steps - last, self.work, self.device)
            if not use:
                self.done = True
                self.report(f"train.compile: skipped for {self.label} ({why})")
                return
            self.compiled = TimedFirstCall(compile_step(self.model, self.device), self.model,
                                           f"{self.label} ({why})", self.report)
            self.install(self.compiled)
            self.compiled_from = taken - 1


def engine_probe(runner: object, steps: int) -> CompileProbe | None:
    """``train.compile=true`` for a batched engine of ``multiseed``: its ``compile_probe``
    (the stacked engine's), or None for an engine that is not compiled (vmap), said so."""
    make = getattr(runner, "compile_probe", None)
    if make is None:
        _console_print(f"train.compile: skipped ({type(runner).__name__} is not compiled)")
        return None
    return make(steps)


def _console_print(line: str) -> None:
    from transformer_lab.results.console import console

    console.print(line)
