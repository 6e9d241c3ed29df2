"""``train.compile=true``: ``torch.compile`` of the training forward (its backward too, through
AOTAutograd), used only where it pays.

A compile costs tens of seconds (``COMPILE_SECONDS``: 20-35 s from a cold cache on the 2-core
CPU, seen by hand; 0.1-4.4 s warm in ``benchmarks/multiseed.csv``) and can save at most a share
of each step (``EXPECTED_SAVING``, an optimistic bound). So a run (``CompileProbe``) first times
``PROBE_STEPS`` eager steps and compiles only if ``steps left x step time x EXPECTED_SAVING >
COMPILE_SECONDS``, never for an overhead-bound CPU step (tokens x d_model <=
``OVERHEAD_BOUND_WORK``: compiled, the ``tiny`` step ran 1.65-1.9x slower, measured once by
hand); then it times as many compiled steps and keeps whichever ran faster. Each decision is
printed (skipped and why; the compile time; compiled vs eager ms/step, kept or back to eager).
On this CPU the compiled ``small`` step measured 1.15-1.26x slower than eager in CPU time
(``benchmarks/multiseed.py --compile``), so runs here end up eager. Those numbers are for a
forward that Dynamo splits into 7-10 graphs (graph breaks at attention's ``ContextVar`` read
and, for a learned PE, its ``.item()`` range check); removing the breaks in a trial only brought
``small`` level with eager, so a whole-graph compile is not yet measured here. Evaluation and
generation stay eager (their shapes vary: each would compile again). A compiled step rounds
differently from an eager one (fused kernels).

``compile_unavailable()`` says why torch.compile cannot run here (on CPU Inductor needs a C++
compiler); ``check_compile`` turns ``train.compile=true`` there into a ``ConfigError`` (exit 2).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import torch
from torch import nn
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

from transformer_lab.errors import ConfigError

PROBE_STEPS = (2, 6)  # eager steps timed before deciding: [2, 6) (the first ones warm up)
COMPILE_SECONDS = 35.0  # one compile of the training forward + backward, 2-core CPU, cold cache
EXPECTED_SAVING = 0.15  # the share of a step a compile might save (optimistic: it is checked)
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
                       f"{OVERHEAD_BOUND_WORK}) runs slower compiled")
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


class UnfusedBias(CustomGraphPass):
    """Inductor post-grad pass (CPU): ``addmm(bias, a, b)`` -> ``mm(a, b) + bias``. ATen's CPU
    addmm first copies the broadcast bias into its fresh output (a whole extra pass over it);
    unfused, the bias add joins the pointwise kernel that follows (GELU, the residual add, the
    head split). Inductor does the same on GPUs only (``unfuse_bias_add_to_pointwise``)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        addmm = torch.ops.aten.addmm.default
        for node in list(graph.find_nodes(op="call_function", target=addmm)):
            if node.kwargs or len(node.args) != 3:  # beta / alpha given: leave it
                continue
            bias, mat1, mat2 = node.args
            with graph.inserting_before(node):
                product = graph.call_function(torch.ops.aten.mm.default, (mat1, mat2))
                total = graph.call_function(torch.ops.aten.add.Tensor, (product, bias))
            product.meta, total.meta = dict(node.meta), dict(node.meta)  # same shape, dtype
            node.replace_all_uses_with(total)
            graph.erase_node(node)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))


def inductor_options(device: str) -> dict[str, object]:
    """Inductor settings of a training-step compile: on CPU ``UnfusedBias``, ``cpp_wrapper``
    (the step's kernel calls from C++, not Python) and ``max_autotune`` (C++ GEMM templates
    where they win: the attention's batched matmuls); Inductor's defaults elsewhere (not
    measured here)."""
    if str(device).startswith("cuda"):
        return {}
    return {"post_grad_custom_post_pass": UnfusedBias(), "cpp_wrapper": True,
            "max_autotune": True}


def compile_step(module: nn.Module, device: str) -> Forward:
    """``torch.compile`` of a training forward (a ``ModelLoss``, or a model) for ``device``:
    static shapes, ``inductor_options``."""
    return torch.compile(module, dynamic=False, options=inductor_options(device))


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
        except Exception as error:  # noqa: BLE001 - any compile failure falls back to eager
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
