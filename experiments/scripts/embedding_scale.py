"""Table and figure of experiments/embedding_scale.md from its ``tlab report`` folders.

    python -m experiments.scripts.embedding_scale runs/embedding_scale \
        --out experiments/embedding_scale.csv --plot experiments/embedding_scale.png

ROOT holds the sweeps (``main``, ``pe_scale``, ``learned_pe8``) and two reports per metric
(``final_loss``, ``early_loss``): ``report/<metric>`` (``tlab report ROOT/main --baseline
model.embed_scale=sqrt``) and ``report_pe_scale/<metric>`` (``tlab report ROOT --baseline
model.pe_scale=1.0``). One row per (comparison, metric, group) is written:

    embed_scale       none vs sqrt per PE (report/: copied, not recomputed)
    pe_scale          PE multiplied by 0.25 .. 8 vs 1, embeddings scaled by sqrt (report_pe_scale/)
    none-sqrt vs rope per seed d = loss(none) - loss(sqrt) for each PE, against RoPE's d (no
                      additive PE): the part of the effect that belongs to the PE
    same ratio        sqrt + pe_scale 8 vs none (the same PE/embedding ratio, everything at the
                      input 8x larger)

The last two are paired by seed with ``transformer_lab.measures.statistics.verdict_table`` (95%
t-intervals, sign-flip test, Holm over the PEs). Every group gets the PE-to-embedding norm
ratio at initialisation that ``tlab smoke`` tests (``routines.smoke.pe_to_embedding_ratio`` on
a training batch, mean over the group's seeds; empty without an additive PE), whether it
exceeds ``PE_SWAMP_RATIO``, and ``steps_to_3``: the median first step at which the smoothed
training loss reaches 3.0 nats, just under the corpus's unigram entropy (3.31) where a model
blind to the token identity stalls.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch

KEYS = ["pe", "model.embed_scale", "model.pe_scale"]
DEFAULTS = {"model.embed_scale": "sqrt", "model.pe_scale": "1.0"}
METRICS = ["final_loss", "early_loss"]
LEVEL = 3.0  # nats: the smoothed training loss a run that sees its tokens passes early
BASE = ["experiment=compare_activations", "routine.activations=[gelu]", "task=text",
        "task.corpus=tinyshakespeare", "task.seq_len=64", "arch=decoder", "model=small",
        "train.batch_size=16"]
VERDICT = ["baseline", "diff_vs_baseline", "diff_ci_low", "diff_ci_high", "p_value",
           "p_adjusted", "verdict", "seeds_needed", "paired_seeds"]


def with_keys(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every key of ``KEYS`` as a string column (a key a sweep did not vary
    takes its default) and ``model.pe_scale`` written as a float (``1.0``, ``8.0``)."""
    for key in KEYS:
        if key not in table.columns:
            table[key] = DEFAULTS[key]
    table = table.astype({k: str for k in KEYS})
    table["model.pe_scale"] = table["model.pe_scale"].map(lambda v: str(float(v)))
    return table


def init_ratio(pe: str, embed_scale: str, pe_scale: str, seed: int) -> tuple[float | None,
                                                                             float, float]:
    """(PE / embedding norm ratio, mean PE norm, mean scaled-embedding norm) at init for one
    seed: the model and a batch of 16 training sequences as the run builds them."""
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.model import build_model
    from transformer_lab.routines.smoke import pe_to_embedding_ratio

    cfg = compose([*BASE, f"pe={pe}", f"model.embed_scale={embed_scale}",
                   f"model.pe_scale={pe_scale}", f"seed={seed}"])
    task = build_task(cfg)
    model = build_model(cfg, seed=seed)
    batch = task.train_batch(int(cfg.train.batch_size), torch.Generator().manual_seed(seed))
    ratio = pe_to_embedding_ratio(model, batch)
    with torch.no_grad():
        embed_norm = (model.embed_scale * model.token_embedding(batch.inputs)).norm(dim=-1)
        pe_norm = float("nan")
        if model.pe_kind == "additive":
            positions = torch.arange(batch.inputs.shape[1])
            pe_norm = (model.pe_scale * model.positional(positions)).norm(dim=-1).mean().item()
    return ratio, pe_norm, embed_norm.mean().item()


def group_facts(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Per group: init ratio and norms (mean over its seeds), the smoke's swamp flag and the
    median step at which the smoothed training loss reaches ``LEVEL``."""
    from transformer_lab.routines.compare import SMOOTHING, ema
    from transformer_lab.routines.smoke import PE_SWAMP_RATIO

    first = {}
    for run_dir, rows in curves.groupby("run_dir", sort=False):
        curve = rows.groupby("step")["loss"].mean()  # (steps,)
        below = [step for step, loss in zip(curve.index, ema(curve.tolist(), SMOOTHING),
                                            strict=True) if loss <= LEVEL]
        first[run_dir] = below[0] if below else float("nan")
    facts = []
    for group, rows in runs.groupby(KEYS, sort=False):
        values = [init_ratio(*group, int(seed)) for seed in sorted(rows["seed"].astype(int))]
        ratios = [r for r, _, _ in values if r is not None]
        ratio = sum(ratios) / len(ratios) if ratios else None
        facts.append({**dict(zip(KEYS, group, strict=True)), "ratio_at_init": ratio,
                      "smoke_flags_swamp": None if ratio is None else ratio > PE_SWAMP_RATIO,
                      "pe_norm": sum(v[1] for v in values) / len(values),
                      "embed_norm": sum(v[2] for v in values) / len(values),
                      f"steps_to_{LEVEL:g}": rows["run_dir"].map(first).median()})
    return pd.DataFrame(facts)


def report_rows(report: Path, comparison: str,
                keep: Callable[[pd.DataFrame], pd.Series] | None = None) -> pd.DataFrame:
    """A report pivot's rows for its metric under common names (mean, std, ci_low, ...)."""
    pivot = with_keys(pd.read_csv(report / "report-pivot.csv", dtype={"seeds": str}))
    metric = next(m for m in METRICS if f"{m}_ci_low" in pivot.columns)
    renamed = {f"{metric}_{part}": part for part in ("mean", "std", "ci_low", "ci_high")}
    table = pivot.rename(columns=renamed)[[*KEYS, "seeds", *renamed.values(), *VERDICT]]
    if keep is not None:
        table = table[keep(table)]
    return table.assign(comparison=comparison, metric=metric)


def tested_strata(table: pd.DataFrame) -> pd.Series:
    """Rows of the (pe, embed_scale) strata where a pe_scale other than 1 was run."""
    strata = table.groupby(["pe", "model.embed_scale"])["model.pe_scale"].transform("nunique")
    return strata > 1


def paired_rows(runs: pd.DataFrame, metric: str, comparison: str) -> pd.DataFrame:
    """The two study-specific paired comparisons (``statistics.verdict_table``, by seed)."""
    from transformer_lab.measures.statistics import verdict_table

    wide = runs.pivot_table(index=["pe", "seed"], columns=["model.embed_scale",
                                                           "model.pe_scale"], values=metric)
    if comparison == "none-sqrt vs rope":
        values = (wide[("none", "1.0")] - wide[("sqrt", "1.0")]).rename("value")
        keys = {"model.embed_scale": "none - sqrt", "model.pe_scale": "1.0"}
        baseline = "rope"
    else:  # same ratio: sqrt with the PE x8 vs none
        values = pd.concat({"sqrt, pe_scale 8": wide[("sqrt", "8.0")],
                            "none": wide[("none", "1.0")]}, names=["variant"])
        keys, baseline = {}, "none"
    frame = values.rename("value").reset_index().dropna()
    variant = "pe" if comparison == "none-sqrt vs rope" else "variant"
    parts = []
    for name, rows in ([("all", frame)] if variant == "pe" else frame.groupby("pe", sort=False)):
        if rows[variant].nunique() < 2:  # no variant beside the baseline (RoPE: no PE to scale)
            continue
        order = [v for v in dict.fromkeys(rows[variant]) if v != baseline] + [baseline]
        rows = rows.set_index(variant).loc[order].reset_index()
        table = verdict_table(rows, variant, "value", baseline=baseline).reset_index()
        stats = rows.groupby(variant, sort=False)["value"].agg(["mean", "std"]).reset_index()
        table = stats.merge(table.rename(columns={"value_ci_low": "ci_low",
                                                  "value_ci_high": "ci_high"}), on=variant)
        table["seeds"] = [",".join(str(int(s)) for s in sorted(rows[rows[variant] == v]["seed"]))
                          for v in table[variant]]
        if variant == "variant":
            table["pe"] = name
            table["model.embed_scale"] = table["variant"].map({"none": "none"}).fillna("sqrt")
            table["model.pe_scale"] = table["variant"].map({"none": "1.0"}).fillna("8.0")
        parts.append(table.assign(**keys, baseline=f"{variant}={baseline}"))
    return pd.concat(parts, ignore_index=True).assign(comparison=comparison, metric=metric)


def plot(table: pd.DataFrame, curves: pd.DataFrame, runs: pd.DataFrame, path: Path) -> None:
    """(a) early training loss per main group; (b, c) early and final loss vs the init ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from transformer_lab.routines.smoke import PE_SWAMP_RATIO

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.3))
    colours = {"sinusoidal": "tab:blue", "learned": "tab:orange", "rope": "tab:green"}
    merged = curves.merge(runs[["run_dir", *KEYS]], on="run_dir")
    for (pe, scale, pe_scale), rows in merged.groupby(KEYS, sort=False):
        if pe_scale != "1.0" and not (pe == "sinusoidal" and pe_scale == "8.0"):
            continue
        mean = rows[rows["step"] <= 200].groupby("step")["loss"].mean()
        style = ":" if pe_scale != "1.0" else ("-" if scale == "sqrt" else "--")
        label = f"{pe}, {scale}" + ("" if pe_scale == "1.0" else f", PE x{float(pe_scale):g}")
        axes[0].plot(mean.index, mean.to_numpy(), color=colours[pe], linestyle=style,
                     label=label)
    axes[0].axhline(3.31, color="grey", linewidth=0.8)
    axes[0].set(xlabel="step", ylabel="training loss (mean over 8 seeds)",
                title="(a) first 200 of 600 steps; grey: unigram entropy")
    axes[0].legend(fontsize=7)
    groups = table[table["comparison"].isin(["embed_scale", "pe_scale"])
                   & table["ratio_at_init"].notna()].drop_duplicates(["metric", *KEYS])
    for ax, metric, letter in ((axes[1], "early_loss", "b"), (axes[2], "final_loss", "c")):
        for _, row in groups[groups["metric"] == metric].iterrows():
            marker = ("s" if row["model.embed_scale"] == "none" else
                      "o" if row["model.pe_scale"] == "1.0" else "^")
            ax.errorbar([row["ratio_at_init"]], [row["mean"]], fmt=marker,
                        color=colours[row["pe"]], capsize=3,
                        yerr=[[row["mean"] - row["ci_low"]], [row["ci_high"] - row["mean"]]])
        rope = table[(table["comparison"] == "embed_scale") & (table["metric"] == metric)
                     & (table["pe"] == "rope") & (table["model.embed_scale"] == "sqrt")]
        ax.axhline(rope["mean"].iloc[0], color=colours["rope"], linewidth=0.8, linestyle=":",
                   label="rope, sqrt (no additive PE)")
        for pe in ("sinusoidal", "learned"):
            ax.plot([], [], "o", color=colours[pe], label=pe)
        ax.legend(fontsize=7)
        ax.axvline(PE_SWAMP_RATIO, color="red", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set(xlabel="PE / embedding norm at init (red: smoke's PE_SWAMP_RATIO)",
               ylabel=f"{metric} (95% CI)",
               title=f"({letter}) {metric}: square none, circle sqrt, triangle sqrt + pe_scale")
        ax.title.set_fontsize(9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, default=Path("experiments/embedding_scale.csv"))
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    from transformer_lab.results.gather import gather

    gathered = gather(args.root)
    runs = with_keys(pd.read_csv(args.root / "report_pe_scale" / "early_loss" / "report.csv"))
    parts = []
    for metric in METRICS:
        parts.append(report_rows(args.root / "report" / metric, "embed_scale"))
        parts.append(report_rows(args.root / "report_pe_scale" / metric, "pe_scale",
                                 tested_strata))
        parts.append(paired_rows(runs, metric, "none-sqrt vs rope"))
        parts.append(paired_rows(runs, metric, "same ratio"))
    table = pd.concat(parts, ignore_index=True).astype({k: str for k in KEYS})
    facts = group_facts(with_keys(gathered.runs.copy()), gathered.curves)
    table = table.merge(facts, on=KEYS, how="left")
    first = ["comparison", "metric", *KEYS, "ratio_at_init", "smoke_flags_swamp"]
    table = table[first + [c for c in table.columns if c not in first]]
    table.to_csv(args.out, index=False)
    print(f"wrote {args.out}: {len(table)} rows")
    if args.plot is not None:
        plot(table, gathered.curves, with_keys(gathered.runs.copy()), args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
