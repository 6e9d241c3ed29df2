"""Which engine trains a run's seeds (``choose_engine``), and why not the others.

Engines (``multiseed`` runs them): ``stacked`` (``seed_stack``, in ``seed_groups``), ``vmap``
(``vmap_seeds``), ``sequential`` (one ``Trainer.fit`` after another). The auto choice: stacked
wherever the model stacks (``seed_stack.stackable``) and a group holds two seeds or more
(``seed_groups.group_size``); else vmap where batching pays (CUDA, or tokens per step x d_model
<= ``BATCH_MAX_WORK`` on CPU) and the model has no state vmap cannot give each seed; else one
after another. ``SeedEngine.describe`` is the line a run prints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from omegaconf import DictConfig
from torch import nn

from transformer_lab.tasks import Batch, Task

ENGINES = ("stacked", "vmap", "sequential")
BATCH_MAX_WORK = 8192  # tokens per step x d_model below which batching seeds pays on CPU


def vectorisable(cfg: DictConfig) -> str | None:
    """None if ``cfg``'s seeds can train as one batched model, else the reason they cannot.

    A component whose class declares ``keeps_running_statistics = True`` (BatchNorm) holds
    module state updated in place, which vmap cannot give each seed."""
    from transformer_lab.config.knowledge import declared

    for group in ("norm_layer", "block", "ffn", "pe"):
        if group in cfg and declared(cfg[group], "keeps_running_statistics") is True:
            return (f"{group}={cfg[group].get('name')} keeps running statistics "
                    "(module state)")
        # a component that says why its seeds must run one after another (ffn=moe)
        reason = declared(cfg[group], "seeds_one_after_another") if group in cfg else None
        if isinstance(reason, str):
            return reason
    dropouts = {k: float(v) for k, v in cfg.model.dropout.items() if v}
    if dropouts:
        return f"dropout {dropouts} draws random numbers that vmap cannot reproduce per seed"
    if cfg.train.get("precision") == "bf16":
        return ("train.precision=bf16: under vmap, autocast skips linear layers with a bias "
                "(they would run in fp32, unlike a single run)")
    return None


def step_work(cfg: DictConfig, task: Task,
              batches: Mapping[int, Sequence[Batch]] | None = None) -> int:
    """Tokens per step x d_model: what decides whether batching seeds pays on a CPU."""
    if batches:
        tokens = next(iter(batches.values()))[0].inputs.numel()
    else:
        tokens = int(cfg.train.batch_size) * int(task.model_seq_len)
    return tokens * int(cfg.model.d_model)


def worth_vectorising(cfg: DictConfig, task: Task,
                      batches: Mapping[int, Sequence[Batch]] | None = None) -> bool:
    """Whether the vmap engine pays: on CUDA, or on CPU for overhead-bound steps (``step_work``
    <= ``BATCH_MAX_WORK``). The stacked engine's own measure is ``seed_groups.group_size``."""
    if str(cfg.train.device).startswith("cuda"):
        return True
    return step_work(cfg, task, batches) <= BATCH_MAX_WORK


def vmap_refusal(cfg: DictConfig, model: nn.Module) -> str | None:
    """None if the vmap engine can train ``model``'s seeds (``cfg`` and the built model agree
    to it), else why not."""
    return vectorisable(cfg) or module_state_refusal(model)


def module_state_refusal(model: nn.Module) -> str | None:
    for module in model.modules():
        if getattr(type(module), "keeps_running_statistics", False) is True or isinstance(
                module, nn.modules.batchnorm._BatchNorm):
            return f"{type(module).__name__} keeps running statistics (module state)"
        if isinstance(module, nn.Dropout) and module.p > 0:
            return f"dropout p={module.p} draws random numbers that vmap cannot reproduce"
        if hasattr(module, "aux_loss"):
            return f"{type(module).__name__} adds an auxiliary loss that vmap does not see"
        if isinstance(getattr(module, "dropout", None), float) and module.dropout > 0:
            return f"attention dropout p={module.dropout} draws random numbers"
    return None


@dataclass(frozen=True)
class SeedEngine:
    """How ``fit_seeds`` trains the seeds: ``name`` in ``ENGINES`` (or ``single`` for one
    seed) and ``why``, in words."""

    name: str
    why: str
    group: int | None = None  # stacked: seeds per stacked group (``seed_groups.group_size``)

    def describe(self, seeds: Sequence[int]) -> str:
        consecutive = list(seeds) == list(range(seeds[0], seeds[0] + len(seeds)))
        label = (f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
                 if consecutive else f"seeds {', '.join(map(str, seeds))}")
        words = {"stacked": "as one seed-stacked model", "vmap": "as one vmap-batched model",
                 "sequential": "one after another", "single": "alone"}[self.name]
        if self.name == "stacked" and self.group is not None and self.group < len(seeds):
            words = (f"as seed-stacked groups of {self.group}, one group after another"
                     if self.group > 1 else "one after another, each as its own run")
        return f"{label} train {words} (seed_engine={self.name}: {self.why})"


def stacking_refusal(cfg: DictConfig, model: nn.Module) -> str | None:
    """None if the seeds of ``model`` can train as one seed-stacked model, else why not."""
    from transformer_lab.training.seed_stack import stackable

    if cfg.train.get("precision") == "bf16":
        return "train.precision=bf16 (batched bf16 kernels round differently from a single run)"
    return stackable(model)


def choose_engine(cfg: DictConfig, task: Task, models: Sequence[nn.Module],
                  budgets: Sequence[int], horizon: int | None = None,
                  batches: Mapping[int, Sequence[Batch]] | None = None,
                  engine: str | None = None, group: int | None = None) -> SeedEngine:
    """The engine for these seeds: ``engine`` if given (``ValueError`` when it cannot train
    them), else stacked where the model stacks, else vmap where it pays, else one after
    another. ``group``: seeds per stacked group (default: ``seed_groups.group_size``)."""
    from transformer_lab.training.seed_groups import GROUP_MAX_WORK, group_size

    if group is None:
        group = group_size(step_work(cfg, task, batches), len(models), str(cfg.train.device))
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not known; valid: {', '.join(ENGINES)}")
    if len(models) == 1:
        return SeedEngine("single", "one seed")
    if engine == "sequential":
        return SeedEngine("sequential", "asked for")
    if horizon is None and len(set(budgets)) > 1:
        why = "budgets differ without a shared schedule horizon"
        if engine is not None:
            raise ValueError(f"engine={engine} cannot train these seeds: {why}")
        return SeedEngine("sequential", why)
    refusals = {"stacked": stacking_refusal(cfg, models[0]),
                "vmap": vmap_refusal(cfg, models[0])}
    if engine is not None:
        if refusals[engine] is not None:
            raise ValueError(f"engine={engine} cannot train these seeds: {refusals[engine]}")
        return SeedEngine(engine, "asked for", group if engine == "stacked" else None)
    where = "CUDA" if str(cfg.train.device).startswith("cuda") else \
        f"tokens x d_model = {step_work(cfg, task, batches)}"
    if refusals["stacked"] is None and group > 1:
        return SeedEngine("stacked", f"{min(group, len(models))} per group ({where})", group)
    if refusals["stacked"] is None:
        refusals["stacked"] = (f"one seed per group here ({where}; a group holds at most "
                               f"{GROUP_MAX_WORK} on CPU: more would spill out of the cache)")
    if refusals["vmap"] is None and worth_vectorising(cfg, task, batches):
        return SeedEngine("vmap", f"pays here ({where})")
    no_vmap = refusals["vmap"] or "does not pay for a step this large on CPU"
    return SeedEngine("sequential", f"stacked: {refusals['stacked']}; vmap: {no_vmap}")
