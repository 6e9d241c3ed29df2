"""``tlab extrapolate``: train at one length, evaluate at longer ones (the seed's pitfall 6.2).

For every positional encoding in ``routine.pes`` and every seed, one model is trained on the task
at ``routine.train_len`` (``task.seq_len``; for ``reverse``/``copy`` under ``arch=decoder`` the
model sees ``2 * train_len`` positions, ``source SEP target``). The trained model is then
evaluated, without retraining, on a task made with the same ``data_seed`` at each length of
``routine.eval_lens`` (``"2x"`` = twice ``train_len``, ``24`` = 24 tokens): held-out loss, token
accuracy and (reverse/copy) exact match by greedy decoding.

RoPE models are evaluated once per entry of ``routine.scalings`` (context-extension remedies,
see :func:`transformer_lab.components.positional.rope_inverse_frequencies`), with
``original_max_len`` = the training model length ``L`` and, at an evaluation length ``L'``:

======================= =================================================================
entry                   what the model's RoPE becomes at ``L'``
======================= =================================================================
``none``                unchanged: plain extrapolation
``linear``              position interpolation (Chen et al. 2023): ``theta_i / s``
``ntk``                 NTK-aware base ``base * s^(d/(d-2))`` (bloc97 2023)
``dynamic``             dynamic NTK: ``s`` recomputed from the current length (factor 1)
``yarn``                YaRN (Peng et al. 2023): per-pair ramp + attention temperature
``base:N``              a plain larger base ``N`` (e.g. 500000, the LLaMA 3 value)
======================= =================================================================

with ``s = max(1, L'/L)`` unless a factor is written after a colon (``yarn:4``). Positional
encodings without a ``scaling`` setting (sinusoidal, learned, ALiBi, T5, NoPE) are evaluated as
trained (``scaling=none``) only. Training with a larger base from the start is ``pe.base=500000``.

With ``routine.finetune_steps > 0`` each (model, scaling) pair is also fine-tuned for that many
steps at every evaluation length longer than ``train_len`` and evaluated again (the position
interpolation recipe: PI + a short fine-tune; with ``none`` it is plain fine-tuning at the longer
length, the paper's baseline).

Every model is built for its training length: ``model.max_len`` (the learned table size) is the
training model length unless ``routine.max_len`` is set. A learned table asked for positions it
does not have (``pe.interpolate=false``) cannot be evaluated there: its rows in
``extrapolation.csv`` get ``status=error`` and the reason, the other encodings still run (this is
the seed's "learned PE fails past its max length"). Bad requests stop the run before anything is
trained (``ConfigError``, exit 2): an evaluation length below 1, an unknown scaling, a factor
<= 0, a scaling with no RoPE encoding in ``routine.pes``, a length the task cannot generate.

Writes ``extrapolation.csv`` (:data:`EXTRAPOLATION_COLUMNS`, one row per pe, scaling, seed,
evaluation length and fine-tune setting), ``extrapolation.png`` (metric vs length per encoding)
and the training rows of every model in ``metrics.csv`` (tagged with ``pe``, ``scaling``,
``seed``, ``phase``).
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.table import Table

from transformer_lab.components.positional.rope_scaling import ROPE_SCALINGS
from transformer_lab.config import build_task
from transformer_lab.config_tree import choice_file, group_choices
from transformer_lab.console import console, print_warning
from transformer_lab.errors import ConfigError, Diverged
from transformer_lab.model import TransformerModel, build_model, instantiate_component
from transformer_lab.results import CsvLog, RunDirectory, TaggedLog
from transformer_lab.routines import RoutineOutcome
from transformer_lab.tasks import Task
from transformer_lab.train import Trainer, count_parameters, sequence_loss, token_accuracy

EXTRAPOLATION_COLUMNS = [
    "pe", "scaling", "train_len", "eval_len", "loss", "accuracy", "exact_match", "seed",
    "factor", "base", "length_ratio", "model_seq_len", "finetune_steps", "train_steps",
    "status", "error",
]
# Scalings whose factor defaults to the length ratio L'/L; ``dynamic`` computes it per length.
RATIO_SCALINGS = ("linear", "ntk", "yarn")
SCALING_CHOICES = (*ROPE_SCALINGS, "base")
_MULTIPLE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*x\s*$")


# --------------------------------------------------------------------------------------------
# the plan: what to train and evaluate, parsed and checked from cfg.routine


@dataclass(frozen=True)
class Scaling:
    """One entry of ``routine.scalings``: ``name`` or ``name:value`` (see module docstring)."""

    name: str  # none | linear | ntk | dynamic | yarn | base
    value: float | None = None  # fixed factor, or the base for ``base``

    @property
    def label(self) -> str:
        if self.value is None:
            return self.name
        return f"{self.name}:{self.value:g}"

    def pe_settings(self, ratio: float, original_max_len: int) -> dict[str, Any]:
        """Overrides of the RoPE config node at length ratio ``ratio = L'/L`` (``{}``: none)."""
        if self.name == "none":
            return {}
        if self.name == "base":
            return {"base": self.value}
        if self.value is not None:
            factor = self.value
        else:
            factor = max(1.0, ratio) if self.name in RATIO_SCALINGS else 1.0
        return {"scaling": self.name, "factor": factor, "original_max_len": original_max_len}


def parse_scaling(entry: Any) -> Scaling:
    """``"yarn"`` -> Scaling("yarn"); ``"linear:2"`` -> factor 2; ``"base:500000"`` -> base."""
    text = str(entry).strip()
    name, _, value_text = text.partition(":")
    valid = ", ".join([*ROPE_SCALINGS, "base:N"])
    if name not in SCALING_CHOICES:
        raise ConfigError(f"routine.scalings: '{text}' is not a RoPE scaling; valid: {valid} "
                          "(a factor may follow a colon, e.g. yarn:4)")
    if not value_text:
        if name == "base":
            raise ConfigError("routine.scalings: 'base' needs a value, e.g. base:500000")
        return Scaling(name)
    if name == "none":
        raise ConfigError(f"routine.scalings: '{text}' - 'none' takes no factor")
    try:
        value = float(value_text)
    except ValueError:
        raise ConfigError(f"routine.scalings: '{text}' - '{value_text}' is not a number") from None
    if name == "base" and not value > 1:
        raise ConfigError(f"routine.scalings: '{text}' - the RoPE base must be > 1")
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"routine.scalings: '{text}' - factor={value_text} is not valid; "
                          "the scaling factor must be > 0")
    return Scaling(name, value)


def parse_eval_length(entry: Any, train_len: int) -> int:
    """``"2x"`` -> ``round(2 * train_len)``; ``24`` or ``"24"`` -> 24. Raises ``ConfigError``."""
    text = str(entry).strip()
    match = _MULTIPLE.match(text)
    try:
        length = round(float(match.group(1)) * train_len) if match else int(text)
    except ValueError:
        raise ConfigError(f"routine.eval_lens: '{text}' is not a length; use a number of tokens "
                          f"(24) or a multiple of the training length {train_len} (2x)") from None
    if length < 1:
        raise ConfigError(f"routine.eval_lens: '{text}' gives an evaluation length of {length}; "
                          "it must be at least 1")
    return length


def _as_list(value: Any) -> list[Any]:
    """A Hydra list, or a comma-separated string, as a Python list (None -> [])."""
    if value is None:
        return []
    if isinstance(value, ListConfig | list | tuple):
        return list(value)
    return [v for v in str(value).split(",") if v.strip()]


@dataclass
class Plan:
    pes: list[str]
    pe_nodes: dict[str, DictConfig]  # pe name -> its config node (unresolved interpolations)
    train_len: int
    eval_lens: list[int]  # sorted, unique
    scalings: list[Scaling]
    seeds: list[int]
    finetune_steps: int
    finetune_lr: float
    max_len: int | None  # learned table size; None = training model length

    def scalings_for(self, pe: str) -> list[Scaling]:
        """The scalings a PE is evaluated with: all of them for RoPE, ``none`` otherwise."""
        return self.scalings if supports_scaling(self.pe_nodes[pe]) else [Scaling("none")]


def supports_scaling(pe_node: DictConfig) -> bool:
    """A PE takes ``routine.scalings`` when its config has a ``scaling`` setting (RoPE)."""
    return "scaling" in pe_node


def pe_node(cfg: DictConfig, name: str) -> DictConfig:
    """The config node of PE ``name``: the composed ``cfg.pe`` (with the user's ``pe.*``
    overrides) when it is that PE, else ``<config tree>/pe/<name>.yaml``."""
    if cfg.pe.get("name") == name:
        return cfg.pe
    path = choice_file("pe", name)
    if path is None:
        raise ConfigError(f"routine.pes: unknown pe '{name}'; valid: "
                          f"{', '.join(group_choices('pe'))}")
    return OmegaConf.load(path)


def make_plan(cfg: DictConfig) -> Plan:
    """Read and check ``cfg.routine``; raises ``ConfigError`` with one line on bad input."""
    r = cfg.routine
    if "seq_len" not in cfg.task:
        raise ConfigError(f"task={cfg.task.get('name')} has no seq_len; extrapolate needs a task "
                          "whose length can be set (reverse, copy, lm, text)")
    pes = [str(p).strip() for p in _as_list(r.get("pes"))] or [str(cfg.pe.get("name"))]
    if len(set(pes)) != len(pes):
        raise ConfigError(f"routine.pes={pes} names a pe twice; list each once")
    nodes = {pe: pe_node(cfg, pe) for pe in pes}
    train_len = r.get("train_len") or cfg.task.seq_len
    if not isinstance(train_len, int) or train_len < 1:
        raise ConfigError(f"routine.train_len={train_len} is not valid; it must be an integer >= 1")
    entries = _as_list(r.get("eval_lens")) or ["1x"]
    eval_lens = sorted({parse_eval_length(e, train_len) for e in entries})
    scalings = [parse_scaling(s) for s in _as_list(r.get("scalings"))] or [Scaling("none")]
    if len({s.label for s in scalings}) != len(scalings):
        raise ConfigError(f"routine.scalings={[s.label for s in scalings]} lists one twice")
    scaled = [s.label for s in scalings if s.name != "none"]
    if scaled and not any(supports_scaling(node) for node in nodes.values()):
        raise ConfigError(f"routine.scalings={scaled} applies to RoPE only, and none of "
                          f"routine.pes={pes} is RoPE; add --pe rope or use --scaling none")
    n_seeds = r.get("seeds", 1)
    if not isinstance(n_seeds, int) or n_seeds < 1:
        raise ConfigError(f"routine.seeds={n_seeds} is not valid; give the number of seeds (>= 1)")
    finetune_steps = r.get("finetune_steps", 0) or 0
    if not isinstance(finetune_steps, int) or finetune_steps < 0:
        raise ConfigError(f"routine.finetune_steps={finetune_steps} is not valid; use 0 (none) "
                          "or a number of steps")
    finetune_lr = r.get("finetune_lr") or cfg.train.lr
    if not isinstance(finetune_lr, int | float) or finetune_lr <= 0:
        raise ConfigError(f"routine.finetune_lr={finetune_lr} is not valid; it must be > 0")
    max_len = r.get("max_len")
    if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
        raise ConfigError(f"routine.max_len={max_len} is not valid; use null or an integer >= 1")
    return Plan(pes, nodes, train_len, eval_lens, scalings,
                [int(cfg.seed) + i for i in range(n_seeds)], finetune_steps, float(finetune_lr),
                max_len)


# --------------------------------------------------------------------------------------------
# configs, tasks and models per length


def config_for(cfg: DictConfig, node: DictConfig, seq_len: int, max_len: int | None) -> DictConfig:
    """A copy of ``cfg`` with PE ``node`` and ``task.seq_len = seq_len``; ``model.max_len`` is
    ``max_len`` when given (the training model length for the models this routine builds)."""
    out = copy.deepcopy(cfg)
    with_flag = OmegaConf.is_struct(out)
    OmegaConf.set_struct(out, False)
    out.pe = copy.deepcopy(node)
    out.task.seq_len = seq_len
    if max_len is not None:
        out.model.max_len = max_len
    OmegaConf.set_struct(out, with_flag)
    return out


def task_at(cfg: DictConfig, seq_len: int, what: str) -> Task:
    """The task at ``seq_len`` (same ``data_seed``); a task that cannot make it is a
    ``ConfigError`` naming ``what`` (e.g. "evaluation length 64")."""
    try:
        return build_task(config_for(cfg, cfg.pe, seq_len, None))
    except ConfigError as exc:
        raise ConfigError(f"{what} ({seq_len} tokens) cannot be generated: {exc}") from None


def tasks_by_length(cfg: DictConfig, plan: Plan) -> dict[int, Task]:
    """The training task and one task per evaluation length, all with the same ``data_seed``
    (the held-out split is the same hash rule at every length)."""
    tasks = {plan.train_len: task_at(cfg, plan.train_len, "the training length")}
    for length in plan.eval_lens:
        if length not in tasks:
            tasks[length] = task_at(cfg, length, f"evaluation length {length}")
    return tasks


def positions_reachable(model: TransformerModel, length: int) -> str | None:
    """None if the model's PE can encode ``length`` positions, else the PE's reason."""
    if model.pe_kind != "additive":
        return None
    try:
        model.positional(torch.arange(length))
    except ValueError as exc:
        return str(exc)
    return None


def scaled_model(model: TransformerModel, cfg_pe: DictConfig, settings: Mapping[str, Any]
                 ) -> TransformerModel:
    """``model`` with its RoPE rebuilt from ``cfg_pe.pe`` plus ``settings`` (no copy when
    ``settings`` is empty). RoPE has no parameters, so the trained weights are shared."""
    if not settings:
        return model
    spec = {**OmegaConf.to_container(cfg_pe.pe, resolve=True), **settings}
    scaled = copy.copy(model)  # shallow: shares the trained weights
    scaled._modules = dict(model._modules)
    scaled._modules["positional"] = instantiate_component(spec, "pe")
    return scaled


@torch.no_grad()
def evaluate(model: TransformerModel, task: Task, device: torch.device) -> dict[str, float]:
    """Held-out loss, token accuracy and exact match (NaN where the task has none), fp32."""
    batch = task.eval_batch().to(device)
    was_training = model.training
    model.eval()
    logits = model(batch.inputs)  # (B, T, V)
    match = task.exact_match(model, batch)
    model.train(was_training)
    return {"loss": sequence_loss(logits.float(), batch.targets).item(),
            "accuracy": token_accuracy(logits, batch.targets),
            "exact_match": math.nan if match is None else match}


# --------------------------------------------------------------------------------------------
# the routine


def check_config(cfg: DictConfig, task: Task) -> None:
    """Pre-flight checks (``routines.check_routine``): the plan parses, every evaluation length
    can be generated, every PE builds. Raises ``ConfigError``; writes nothing."""
    plan = make_plan(cfg)
    train_task = tasks_by_length(cfg, plan)[plan.train_len]
    for pe in plan.pes:
        cfg_pe = config_for(cfg, plan.pe_nodes[pe], plan.train_len,
                            plan.max_len or train_task.model_seq_len)
        cfg_pe.model.vocab_size = train_task.vocab_size
        build_model(cfg_pe)  # errors name the pe group


def run_extrapolate(cfg: DictConfig, run: RunDirectory) -> RoutineOutcome:
    started = time.perf_counter()
    plan = make_plan(cfg)
    device = torch.device(cfg.train.device)
    rows: list[dict[str, Any]] = []
    params: dict[str, int] = {}
    table = run.log("extrapolation", EXTRAPOLATION_COLUMNS)
    tasks = tasks_by_length(cfg, plan)
    scaled = [s.label for s in plan.scalings if s.name != "none"]
    unscalable = [pe for pe in plan.pes if not supports_scaling(plan.pe_nodes[pe])]
    if scaled and unscalable:
        print_warning(f"{', '.join(unscalable)}: no RoPE scaling, evaluated as trained only "
                      f"(not with {', '.join(scaled)})")
    for pe in plan.pes:
        for seed in plan.seeds:
            new_rows, params[pe] = _study_one_model(cfg, plan, tasks, pe, seed, device, run,
                                                    table)
            rows.extend(new_rows)
    plot_path = plot_extrapolation(rows, run.path / "extrapolation.png", plan.train_len)
    console.print(results_table(rows, f"tlab extrapolate - {run.path}"))
    console.print(f"wrote {table.path}" + (f" and {plot_path}" if plot_path else ""))
    ok_rows = [row for row in rows if row["status"] == "ok"]
    train_rows = [row for row in ok_rows if row["eval_len"] == plan.train_len
                  and row["scaling"] == "none" and not row["finetune_steps"]]
    return RoutineOutcome(
        passed=bool(ok_rows),
        summary={
            "pe": ",".join(plan.pes), "seq_len": plan.train_len,
            "params": max(params.values(), default=None), "steps": int(cfg.train.steps),
            "final_loss": _mean([row["loss"] for row in train_rows]),
            "best_exact_match": max((row["exact_match"] for row in ok_rows
                                     if not math.isnan(row["exact_match"])), default=None),
            "wall_s": time.perf_counter() - started,
        },
        message="" if ok_rows else "no evaluation could run; see extrapolation.csv",
    )


def _study_one_model(cfg: DictConfig, plan: Plan, tasks: Mapping[int, Task], pe: str, seed: int,
                     device: torch.device, run: RunDirectory, table: CsvLog
                     ) -> tuple[list[dict[str, Any]], int]:
    """Train one model at ``plan.train_len``; evaluate it at every length and scaling. Each row
    is written to ``table`` as soon as it exists (an interrupted run keeps them)."""
    node = plan.pe_nodes[pe]
    train_task = tasks[plan.train_len]
    original_max_len = train_task.model_seq_len
    cfg_pe = config_for(cfg, node, plan.train_len, plan.max_len or original_max_len)
    cfg_pe.model.vocab_size = train_task.vocab_size
    torch.manual_seed(seed)
    model = build_model(cfg_pe).to(device)
    base_row = {"pe": pe, "train_len": plan.train_len, "seed": seed,
                "train_steps": int(cfg.train.steps)}
    log = TaggedLog(run.metrics, pe=pe, scaling="none", seed=seed, phase="train",
                    seq_len=plan.train_len)
    trainer = Trainer(model, train_task, cfg.train, cfg.model.d_model, seed, log)
    try:
        with console.status(f"extrapolate: training pe={pe} seed={seed} at length "
                            f"{plan.train_len} ({cfg.train.steps} steps)"):
            trainer.fit(int(cfg.train.steps))
    except Diverged as exc:
        rows = [_error_row(base_row, scaling.label, length, f"training diverged: {exc}")
                for scaling in plan.scalings_for(pe) for length in plan.eval_lens]
        table.write_all(rows)
        return rows, 0
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        table.write(row)
        rows.append(row)

    for length in plan.eval_lens:
        eval_task = tasks[length]
        ratio = length / plan.train_len
        for scaling in plan.scalings_for(pe):
            settings = scaling.pe_settings(ratio, original_max_len)
            row = {**base_row, "scaling": scaling.label, "eval_len": length,
                   "length_ratio": ratio, "model_seq_len": eval_task.model_seq_len,
                   "factor": settings.get("factor"),
                   "base": settings.get("base", node.get("base")) if supports_scaling(node)
                   else None}
            scaled = scaled_model(model, cfg_pe, settings)
            emit(_evaluated_row(row, scaled, eval_task, device, finetune_steps=0))
            if plan.finetune_steps and length > plan.train_len:
                tuned = copy.deepcopy(scaled)
                reason = positions_reachable(tuned, eval_task.model_seq_len)
                if reason is None:
                    reason = _finetune(cfg, plan, tuned, eval_task, seed, run, pe, scaling, length)
                emit(_evaluated_row(row, tuned, eval_task, device,
                                    finetune_steps=plan.finetune_steps, reason=reason))
    return rows, count_parameters(model)


def _finetune(cfg: DictConfig, plan: Plan, model: TransformerModel, task: Task, seed: int,
              run: RunDirectory, pe: str, scaling: Scaling, length: int) -> str | None:
    """Fine-tune ``model`` in place at ``length``; returns an error reason or None."""
    train_cfg = copy.deepcopy(cfg.train)
    train_cfg.lr = plan.finetune_lr
    train_cfg.warmup = 0
    log = TaggedLog(run.metrics, pe=pe, scaling=scaling.label, seed=seed, phase="finetune",
                    seq_len=length)
    trainer = Trainer(model, task, train_cfg, cfg.model.d_model, seed, log)
    try:
        with console.status(f"extrapolate: fine-tuning pe={pe} {scaling.label} at length "
                            f"{length} ({plan.finetune_steps} steps)"):
            trainer.fit(plan.finetune_steps)
    except Diverged as exc:
        return f"fine-tuning diverged: {exc}"
    return None


def _evaluated_row(row: dict[str, Any], model: TransformerModel, task: Task,
                   device: torch.device, finetune_steps: int,
                   reason: str | None = None) -> dict[str, Any]:
    row = {**row, "finetune_steps": finetune_steps}
    reason = reason or positions_reachable(model, task.model_seq_len)
    if reason is not None:
        return {**row, "status": "error", "error": reason}
    return {**row, **evaluate(model, task, device), "status": "ok"}


def _error_row(base_row: dict[str, Any], scaling: str, length: int, reason: str
               ) -> dict[str, Any]:
    return {**base_row, "scaling": scaling, "eval_len": length, "finetune_steps": 0,
            "length_ratio": length / base_row["train_len"], "status": "error", "error": reason}


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return sum(finite) / len(finite) if finite else None


# --------------------------------------------------------------------------------------------
# reporting


def curve_label(row: Mapping[str, Any]) -> str:
    """``rope``, ``rope+yarn``, ``rope+linear ft200``: one curve per label."""
    label = str(row["pe"])
    if row["scaling"] != "none":
        label += f"+{row['scaling']}"
    if row.get("finetune_steps"):
        label += f" ft{row['finetune_steps']}"
    return label


def mean_curves(rows: list[Mapping[str, Any]], metric: str
                ) -> dict[str, list[tuple[int, float]]]:
    """label -> [(eval_len, mean of ``metric`` over seeds)] for rows with status ok."""
    grouped: dict[str, dict[int, list[float]]] = {}
    for row in rows:
        value = row.get(metric)
        if row["status"] != "ok" or value is None or math.isnan(value):
            continue
        grouped.setdefault(curve_label(row), {}).setdefault(row["eval_len"], []).append(value)
    return {label: sorted((length, sum(v) / len(v)) for length, v in by_len.items())
            for label, by_len in grouped.items()}


def plot_extrapolation(rows: list[Mapping[str, Any]], path: Path, train_len: int) -> Path | None:
    """Token accuracy, exact match (if any) and loss against evaluation length: one colour per
    PE (+scaling), dashed after fine-tuning, mean over seeds; a dotted line marks the training
    length. Returns None (no file) when no row has a number."""
    panels = {metric.replace("_", " "): curves for metric in ("accuracy", "exact_match", "loss")
              if (curves := mean_curves(rows, metric))}
    if not panels:
        return None
    from transformer_lab.plots import length_curves

    lengths = sorted({r["eval_len"] for r in rows})
    return length_curves(path, panels, lengths, mark=train_len,
                         unit_panels=("accuracy", "exact match"))


def results_table(rows: list[Mapping[str, Any]], title: str) -> Table:
    """Terminal table: one line per curve, one column per evaluation length (mean over seeds):
    exact match / token accuracy for seq2seq tasks, token accuracy / loss for LM."""
    has_match = any(r["status"] == "ok" and not math.isnan(r.get("exact_match", math.nan))
                    for r in rows)
    first, second = ("exact_match", "accuracy") if has_match else ("accuracy", "loss")
    lengths = sorted({r["eval_len"] for r in rows})
    table = Table(title=f"{title}\n{first} / {second} by evaluation length (mean over seeds)")
    table.add_column("pe (+scaling, fine-tune)")
    for length in lengths:
        table.add_column(str(length), justify="right")
    curves = {m: mean_curves(rows, m) for m in (first, second)}
    labels = list(dict.fromkeys(curve_label(r) for r in rows))
    for label in labels:
        cells = []
        for length in lengths:
            a = dict(curves[first].get(label, [])).get(length)
            b = dict(curves[second].get(label, [])).get(length)
            errors = [r for r in rows if curve_label(r) == label and r["eval_len"] == length
                      and r["status"] == "error"]
            if a is None and b is None:
                cells.append("[red]error[/]" if errors else "")
            else:
                cells.append(f"{_fmt(a)} / {_fmt(b)}")
        table.add_row(label, *cells)
    return table


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
