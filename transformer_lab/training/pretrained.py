"""Weights a run starts from instead of its own initialisation: a Hugging Face checkpoint
(``from_hf=DIR``) or a tlab run's trained model (``from_run=FILE``). Before composing the option
becomes the source's architecture overrides; after building, its weights are loaded."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.results.tracking import flatten
from transformer_lab.training.checkpoint import choose_model, read_header

# The config groups that make a model's architecture (``model`` has no choice: its keys do).
ARCHITECTURE_GROUPS = ("pe", "ffn", "block", "norm_layer")
NOT_COPIED = {"model.vocab_size"}  # the command's task decides it
CHOICE = re.compile(r"[\w-]+")  # a group choice read from a run: a file name, no path
KEY = re.compile(r"[A-Za-z_]\w*")  # a key read from a run, as an override names it


def pretrained_option(spec: RunSpec) -> str | None:
    """``--from-hf`` or ``--from-run`` when ``spec`` starts from weights (None otherwise)."""
    return "--from-hf" if spec.from_hf else "--from-run" if spec.from_run else None


def load_pretrained(model: nn.Module, spec: RunSpec) -> None:
    """Load the weights ``spec`` names into ``model``: ``from_hf``'s, or ``from_run``'s tensors
    (vocabulary cut to the task's; tied names filled), read as data. ``ConfigError`` if they do
    not fit, naming the first architecture key that differs from the run's."""
    from safetensors.torch import load_file

    from transformer_lab.interop.hf import load_fitted, load_hf_weights

    from_hf, from_run = spec.from_hf, spec.from_run
    if from_hf:
        load_hf_weights(model, spec.model, from_hf)
    if not from_run:
        return
    path = Path(from_run)
    # its header was checked when from_run= was expanded (run_overrides); a job of a sweep may
    # run in another process, without --trust-code's context: only the tensors are read here
    try:
        state = load_file(str(path), device="cpu")
    except Exception as exc:
        raise ConfigError(f"--from-run {path} is not a readable safetensors file "
                          f"({type(exc).__name__})") from None
    own = model.state_dict()
    for name, tensor in own.items():
        if name not in state:
            tied = next((other for other, t in own.items() if other in state
                         and t.data_ptr() == tensor.data_ptr()), None)
            if tied is not None:
                state[name] = state[tied]
    try:
        load_fitted(model, state, f"--from-run {path}")
    except ConfigError as exc:
        try:
            differing = architecture_difference(spec.model, read_header(path).spec.model)
        except ConfigError:  # a header this process may not read (see above)
            differing = ""
        raise ConfigError(f"{exc}{differing}") from None


def architecture(model: ModelSpec) -> dict[str, dict[str, Any]]:
    """``model`` and each of its architecture groups -> its keys, flattened (``model.d_model``,
    ``pe.base``) -> value."""
    return {group: flatten(model.settings() if group == "model" else dict(model.component(group)),
                           group) for group in ("model", *ARCHITECTURE_GROUPS)}


def architecture_difference(model: ModelSpec, run_model: ModelSpec) -> str:
    """``"; model.d_model is 64 here, 32 in the run"`` for the first architecture key that differs;
    ``""`` if none."""
    for ours, theirs in zip(architecture(model).values(), architecture(run_model).values(),
                            strict=True):
        for key in sorted(set(ours) | set(theirs)):
            if key not in NOT_COPIED and ours.get(key) != theirs.get(key):
                return (f"; {key} is {ours.get(key, 'absent')} here, "
                        f"{theirs.get(key, 'absent')} in the run")
    return ""


def run_weights_file(path: Path) -> Path:
    """The one weights file ``--from-run`` names (``ConfigError`` listing a run's files when it has
    several)."""
    header, models = choose_model(path, option="--from-run")
    if path.is_dir() and len(models) > 1:
        files = ", ".join(str(h.path) for h in models[:4])
        raise ConfigError(f"--from-run {path} holds {len(models)} models; give one of its "
                          f"files: {files}{', ...' if len(models) > 4 else ''}")
    return header.path.resolve()


def run_overrides(path: Path) -> list[str]:
    """The overrides that build a weights file's architecture: ``arch`` and the component choices,
    then every key of ``model`` and those groups (``++``)."""
    model = read_header(path).spec.model  # checked: tlab's components only (or --trust-code's)
    out = [f"arch={'decoder' if model.causal else 'encoder'}"]
    for group in ARCHITECTURE_GROUPS:
        choice = str(model.component(group).name)
        if not CHOICE.fullmatch(choice):  # a file of a config tree's group folder, no path
            raise ConfigError(f"{path}: {group}.name={choice!r} names no choice of {group}")
        out.append(f"{group}={choice}")
    for settings in architecture(model).values():
        for key, value in settings.items():
            if not all(KEY.fullmatch(part) for part in key.split(".")):
                raise ConfigError(f"{path}: {key!r} is not a config key")
            if key not in NOT_COPIED:
                out.append(f"++{key}={hydra_value(value)}")
    return out


def hydra_value(value: Any) -> str:
    """A value as Hydra's override grammar reads it back: null, true, 3, 0.5, [1,2], 'text'."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    # Hydra reads a backslash as an escape only before a quote or at the end of a quoted value
    text = re.sub(r"(\\+)('|$)", lambda m: m.group(1) * 2 + m.group(2), str(value))
    return "'" + text.replace("'", "\\'") + "'"
