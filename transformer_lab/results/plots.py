"""Shared matplotlib helpers (Agg backend: files only, no display). Every helper writes one PNG
and closes its figure, so long sweeps do not accumulate open figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

DPI = 120


def save(fig: plt.Figure, path: Path, tight: bool = True) -> Path:
    """Write ``fig`` to ``path`` (PNG) and close it."""
    if tight:  # not for a figure with constrained layout
        fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def distinct_styles(n: int) -> list[dict]:
    """``n`` line styles that stay apart: tab10 colours up to 10 lines, tab20 up to 20, then
    tab20 again with dashed, dotted and dash-dot lines."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    lines = ("-", "--", ":", "-.")
    return [{"color": cmap(i % cmap.N), "linestyle": lines[(i // cmap.N) % len(lines)]}
            for i in range(n)]


def line_plot(path: Path, x: Sequence[float] | np.ndarray,
              series: Mapping[str, Sequence[float] | np.ndarray], title: str, xlabel: str,
              ylabel: str, legend_title: str | None = None) -> Path:
    """One line per entry of ``series`` (label -> y values over ``x``)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, y in series.items():
        ax.plot(x, y, label=label, linewidth=1.4)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(alpha=0.3)
    if len(series) > 1:
        ax.legend(title=legend_title, fontsize=8, ncol=2 if len(series) > 6 else 1)
    return save(fig, path)


def heatmap(path: Path, matrix: np.ndarray, title: str, xlabel: str, ylabel: str,
            colorbar_label: str) -> Path:
    """``matrix`` (rows -> y axis, columns -> x axis) as an image with a colour bar centred on
    0."""
    fig, ax = plt.subplots(figsize=(8, 5))
    finite = matrix[np.isfinite(matrix)]
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    image = ax.imshow(matrix, aspect="auto", origin="upper", cmap="RdBu_r",
                      interpolation="nearest", vmin=-limit, vmax=limit)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    fig.colorbar(image, ax=ax, label=colorbar_label)
    return save(fig, path)


def heatmap_grid(path: Path, matrices: Sequence[np.ndarray], titles: Sequence[str],
                 suptitle: str, xlabel: str, ylabel: str, columns: int = 4) -> Path:
    """Small multiples: one heat map per matrix, each with its own colour bar."""
    rows, cols = -(-len(matrices) // columns), min(columns, len(matrices))
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.9 * rows), squeeze=False,
                             layout="constrained")
    for ax, matrix, title in zip(axes.flat, matrices, titles, strict=False):
        image = ax.imshow(np.where(np.isfinite(matrix), matrix, np.nan), aspect="auto",
                          cmap="viridis", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        fig.colorbar(image, ax=ax, shrink=0.9)
    for ax in list(axes.flat)[len(matrices):]:
        ax.axis("off")
    fig.suptitle(suptitle)
    return save(fig, path, tight=False)


def length_curves(path: Path, panels: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
                  lengths: Sequence[int], mark: int | None = None,
                  unit_panels: Sequence[str] = ()) -> Path:
    """Metrics against sequence length (``tlab extrapolate``): a panel per metric, a line per label
    (``label -> [(length, value)]``, " ft": fine-tuned, dashed, in its base label's colour), log2
    length axis, a dotted line at ``mark`` (training length); ``unit_panels``: y in [0, 1]."""
    bases = list(dict.fromkeys(label.split(" ft")[0] for curves in panels.values()
                               for label in curves))
    colours = {base: style["color"]
               for base, style in zip(bases, distinct_styles(len(bases)), strict=True)}
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels) + 1.6, 3.6),
                             squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels.items(), strict=True):
        for label, points in curves.items():
            xs, ys = zip(*points, strict=True)
            tuned = " ft" in label
            ax.plot(xs, ys, "--" if tuned else "-", marker="s" if tuned else "o", markersize=3,
                    color=colours[label.split(" ft")[0]], label=label)
        if mark is not None:
            ax.axvline(mark, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(lengths), [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("sequence length" + (" (dotted: training length)" if mark else ""))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if title in unit_panels:
            ax.set_ylim(-0.03, 1.03)
    axes[0][-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return save(fig, path)
