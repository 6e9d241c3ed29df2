"""Will the run fit? The pre-flight's rough memory estimate against the memory available;
``--force`` runs anyway (the parts: ``docs/cli.md``)."""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.measures.parameters import layer_activation_terms, parameter_breakdown
from transformer_lab.routines import workload
from transformer_lab.training.distributed import resolve_device

BYTES_PER_PARAMETER = 16
OBJECT_BYTES_PER_MODEL = 256 * 1024
_GB = 1024**3


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo``; else free pages (``os.sysconf``); None if unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _parameters(m: ModelSpec) -> int:
    """The model's parameters by formula; a rough count where a component declares none."""
    try:
        return int(parameter_breakdown(m)["total"])
    except Exception:  # a user's own component that declares nothing usable
        return int(m.n_layers * (4 * m.d_model**2 + 3 * m.d_model * m.d_ff)
                   + 2 * m.vocab_size * m.d_model)


def _layer_bytes(m: ModelSpec, batch: int, seq_len: int) -> int:
    try:
        return int(sum(layer_activation_terms(m, batch, seq_len, 4).values()))
    except Exception:  # none declared (None), or not computable
        return batch * seq_len * 4 * (9 * m.d_model + 3 * m.d_ff)


def estimate(spec: RunSpec, task: Any) -> dict[str, int]:
    """Bytes the run needs, by part (``total`` included); ``model.vocab_size`` filled in."""
    load = workload(spec, task)  # the routine's: models held at once, batch, lengths
    models, batch, train_len, eval_len = load.models, load.batch, load.train_len, load.eval_len
    m = spec.model
    params = _parameters(m)
    vocab, n_layers = int(m.vocab_size), m.n_layers
    eval_size = int(spec.task.get("eval_size") or batch)
    parts = {
        "parameters": params,
        "model_state": models * params * BYTES_PER_PARAMETER,
        "activations": n_layers * _layer_bytes(m, batch, train_len)
        + 3 * batch * train_len * vocab * 4,  # one training step at a time
        "evaluation": _layer_bytes(m, eval_size, eval_len) + eval_size * eval_len * vocab * 4,
        "python_objects": models * OBJECT_BYTES_PER_MODEL,
    }
    parts["total"] = sum(v for k, v in parts.items() if k != "parameters")
    return parts


def _gb(n: float) -> str:
    if n >= 1e5 * _GB:
        return f"{n / _GB:.2e} GB"
    return f"{n / _GB:.1f} GB" if n >= 0.1 * _GB else f"{n / 1024**2:.0f} MB"


# The reversal check (reverse-task, validate's step 3) on a CPU: query-key pairs one training
# step or held-out evaluation may attend over (sequences x length^2); past it, minutes each.
CHECK_ROUTINES = ("reverse_task", "validate")
CPU_CHECK_ATTENTION_PAIRS = 2**25


def check_resources(spec: RunSpec, task: Any) -> None:
    """``ConfigError`` with the numbers when the run cannot fit in memory or (a reversal check
    on a CPU) finish in minutes; unless ``force`` is true."""
    if spec.force:
        return
    device = str(resolve_device(spec.train.device))  # auto: cuda or cpu
    if device == "cpu" and spec.routine.name in CHECK_ROUTINES:
        check_attention_work(spec, task)
    parts = estimate(spec, task)
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        where, available = f"free on {device}", int(free)
    else:
        where, available = "available", available_memory_bytes()
    if available is None or parts["total"] <= 0.9 * available:
        return
    raise ConfigError(f"this run needs about {_gb(parts['total'])} of memory, "
                      f"{_gb(available)} {where}; most for {dominant(spec, task, parts)}: "
                      "shrink it or use --force")


def dominant(spec: RunSpec, task: Any, parts: dict[str, int]) -> str:
    """The largest part of the estimate, naming the settings behind it."""
    load, m = workload(spec, task), spec.model
    part = max(("model_state", "activations", "evaluation", "python_objects"),
               key=parts.__getitem__)
    held = f"{load.models} models held at once, each " if load.models > 1 else ""
    if part == "python_objects":
        return f"{held}{_gb(OBJECT_BYTES_PER_MODEL)} of Python objects"
    if part == "model_state":
        return (f"{held}{parts['parameters']:.3g} parameters (model.d_model={m.d_model}, "
                f"model.n_layers={m.n_layers})")
    if part == "activations":
        batch_key = "routine.batch_size" if spec.routine.get("batch_size") == load.batch \
            and spec.train.batch_size != load.batch else "train.batch_size"
        return (f"training at {load.batch}x{load.train_len} tokens ({batch_key}={load.batch}, "
                f"task.seq_len={spec.task.get('seq_len') or '?'})")
    lens = spec.routine.get("eval_lens")
    setting = f"routine.eval_lens={list(lens)}" if lens else "task.eval_size"
    return (f"evaluation at {spec.task.get('eval_size') or load.batch}x{load.eval_len} tokens "
            f"({setting})")


def check_attention_work(spec: RunSpec, task: Any) -> None:
    """``ConfigError`` naming the largest ``--seq-len`` when a step or the held-out evaluation
    attends over more than ``CPU_CHECK_ATTENTION_PAIRS`` query-key pairs."""
    load = workload(spec, task)
    eval_size = int(spec.task.get("eval_size") or load.batch)
    key, sequences = max((("train.batch_size", load.batch), ("task.eval_size", eval_size)),
                         key=lambda item: item[1])
    pairs = sequences * load.train_len**2
    if pairs <= CPU_CHECK_ATTENTION_PAIRS:
        return
    seq_len = int(spec.task.get("seq_len") or load.train_len)
    per_token = load.train_len / seq_len  # a decoder reads source SEP target: 2x the tokens
    longest = int(math.isqrt(CPU_CHECK_ATTENTION_PAIRS // sequences) / per_token)
    raise ConfigError(
        f"task.seq_len={seq_len} (--seq-len) is too long for the reversal check on a CPU: "
        f"{key}={sequences} sequences attend over {sequences} x {load.train_len}^2 = "
        f"{pairs:.2g} query-key pairs, the limit is {CPU_CHECK_ATTENTION_PAIRS:.2g} (minutes "
        f"per step past it); use --seq-len {longest} or less, or --force")
