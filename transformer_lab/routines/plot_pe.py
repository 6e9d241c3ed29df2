"""``tlab plot-pe``: what a positional encoding looks like, as PNG files and ``pe_values.csv``
(the files per PE kind: docs/routines.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from transformer_lab.config.instantiate import instantiate_component
from transformer_lab.config.schema import COUNT, POSITIVE, Rule, int_rule
from transformer_lab.config.spec import RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.results import plots
from transformer_lab.results.console import console
from transformer_lab.results.run_directory import RunDirectory
from transformer_lab.routines import JobInputs, RoutineOutcome
from transformer_lab.training.pretrained import pretrained_option


def checked_dims(spec: RunSpec, width: int, what: str) -> list[int]:
    """``routine.dims`` if all are below ``width``; of a checkpoint's PE (whose width is not the
    default one) only those that are."""
    dims = list(spec.routine.dims)
    if pretrained_option(spec) and any(0 <= d < width for d in dims):
        dims = [d for d in dims if 0 <= d < width]
    if bad := [d for d in dims if not 0 <= d < width]:
        raise ConfigError(f"routine.dims={bad} not valid for {what} {width}; use 0..{width - 1}")
    return dims


def write_values(run: RunDirectory, positions: np.ndarray,
                 columns: dict[str, np.ndarray]) -> None:
    rows = [{"position": int(p), **{name: float(v[i]) for name, v in columns.items()}}
            for i, p in enumerate(positions)]
    run.write_table("pe_values", rows, ["position", *columns])


def plot_additive(spec: RunSpec, pe: torch.nn.Module, run: RunDirectory) -> list[Path]:
    length, name = int(spec.routine.max_len), spec.model.pe.name
    with torch.no_grad():
        table = pe(torch.arange(length)).float().numpy()  # (L, D)
    dims = checked_dims(spec, table.shape[1], "d_model")
    positions = np.arange(length)
    curves = {f"dim {d}": table[:, d] for d in dims}
    write_values(run, positions, curves)
    return [
        plots.line_plot(run.path / "pe_curves.png", positions, curves,
                        f"pe={name}: value vs position (d_model {table.shape[1]})", "position",
                        "PE value", legend_title="dimension"),
        plots.heatmap(run.path / "pe_heatmap.png", table, f"pe={name}: position x dimension",
                      "dimension", "position", "PE value"),
    ]


def rope_scores(pe: torch.nn.Module, head_dim: int, length: int) -> np.ndarray:
    """q . R(d) k / (|q| |k|) for q = k = ones at query position 0 and key position d."""
    ones = torch.ones(1, 1, length, head_dim)  # (B, H, T, Dh)
    with torch.no_grad():
        q, k = pe(ones, ones, torch.arange(length))
    return ((q[..., :1, :] * k).sum(-1) / head_dim).flatten().numpy()  # (T,)


def plot_rotary(spec: RunSpec, pe: torch.nn.Module, run: RunDirectory) -> list[Path]:
    length, name = int(spec.routine.max_len), spec.model.pe.name
    head_dim = int(pe.head_dim)
    cos = pe.cos_sin(torch.arange(length))[0].numpy()  # (L, rot/2)
    dims = checked_dims(spec, head_dim, "head_dim")
    positions = np.arange(length)
    curves = {f"dim {d} (pair {d // 2})": cos[:, d // 2] for d in dims if d // 2 < cos.shape[1]}
    configured = float(spec.model.pe["base"])
    scores = {f"base {configured:g} (configured)": rope_scores(pe, head_dim, length)}
    for base in map(float, spec.routine.rope_bases):
        if base != configured:
            other = {**spec.model.pe, "base": base}
            scores[f"base {base:g}"] = rope_scores(instantiate_component(other, "pe"), head_dim,
                                                   length)
    write_values(run, positions, {**{f"cos {k}": v for k, v in curves.items()},
                                  **{f"score {k}": v for k, v in scores.items()}})
    return [
        plots.line_plot(run.path / "pe_curves.png", positions, curves,
                        f"pe={name} ({pe.style}): cos(m theta_i) vs position m", "position m",
                        "cos(m theta_i)", legend_title="dimension"),
        plots.heatmap(run.path / "pe_heatmap.png", cos,
                      f"pe={name}: cos(m theta_i), position x pair (head_dim {head_dim})",
                      "pair i", "position m", "cos"),
        plots.line_plot(run.path / "rope_score_vs_distance.png", positions, scores,
                        f"pe={name}: q.R(d)k / |q||k| for q = k = 1 (head_dim {head_dim})",
                        "relative distance d", "normalised score"),
    ]


def plot_bias(spec: RunSpec, pe: torch.nn.Module, run: RunDirectory) -> list[Path]:
    length, name = int(spec.routine.max_len), spec.model.pe.name
    with torch.no_grad():
        bias = pe(length, length).float().numpy()  # (H, T, T)
    last = bias[:, -1, ::-1]  # (H, T): last query, keys at distance 0 .. T-1
    slopes = getattr(pe, "slopes", None)
    labels = [f"head {h}" + (f" (m={float(slopes[h]):.3g})" if slopes is not None else "")
              for h in range(bias.shape[0])]
    distance = np.arange(length)
    curves = {label: last[h] for h, label in enumerate(labels)}
    write_values(run, distance, curves)
    return [
        plots.line_plot(run.path / "pe_bias_vs_distance.png", distance, curves,
                        f"pe={name}: bias of the last query vs distance to the key", "distance",
                        "bias added to the logit", legend_title="head"),
        plots.heatmap_grid(run.path / "pe_bias_heads.png", list(bias),
                           [f"head {h}" for h in range(bias.shape[0])],
                           f"pe={name}: bias[h, query, key]", "key", "query"),
    ]


PLOTTERS: dict[str, Callable[[RunSpec, torch.nn.Module, RunDirectory], list[Path]]] = {
    "additive": plot_additive, "rotary": plot_rotary, "bias": plot_bias}


# The routine's own keys (``routines.check_settings``).
SETTINGS = {"max_len": int_rule(2), "dims": Rule("list", item=COUNT, min_items=1),
            "rope_bases": Rule("list", item=POSITIVE)}
STEPS = None  # it trains no model (``routines.check_unread``)


def check_config(spec: RunSpec, inputs: JobInputs) -> None:
    """Pre-flight: a PE kind that has a plot, and dimensions that the PE has."""
    pe = spec.model.pe.build()
    kind = getattr(pe, "kind", None)
    if kind not in PLOTTERS:
        raise ConfigError(f"pe={spec.model.pe.name} (kind {kind!r}) has nothing to plot; "
                          f"plotted kinds: {', '.join(PLOTTERS)}")
    if kind == "additive":
        checked_dims(spec, spec.model.d_model, "d_model")
    elif kind == "rotary":
        checked_dims(spec, int(pe.head_dim), "head_dim")


def run_plot_pe(spec: RunSpec, run: RunDirectory, inputs: JobInputs) -> RoutineOutcome:
    started = time.perf_counter()
    torch.manual_seed(spec.seed)
    # --from-hf, --from-run: the checkpoint's PE, its weights loaded into the model in pre-flight
    pe = inputs.model.positional if pretrained_option(spec) else spec.model.pe.build()
    files = PLOTTERS[pe.kind](spec, pe, run)
    for path in files:
        console.print(f"wrote {path}")
    return RoutineOutcome(passed=True, summary={"wall_s": time.perf_counter() - started})
