"""What a run is, typed: the model (sizes, knobs and its components), the task, the training,
the routine's settings and the seeds. ``RunSpec.of(cfg)`` builds it once from the composed and
checked config; below the app (``app/``) and config (``config/``) layers, code takes a
``RunSpec`` or one of its parts, never an OmegaConf node."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omegaconf import DictConfig

COMPONENT_GROUPS = ("pe", "block", "norm_layer", "ffn")
TLAB_KEYS = ("name", "_target_", "params", "rest", "lr_ratio")  # optimizer keys, not arguments


class ConfigNode(Mapping[str, Any]):
    """Read-only mapping access to a frozen dataclass's ``node``: a config node's keys and
    values, interpolations resolved."""

    node: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.node[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.node)

    def __len__(self) -> int:
        return len(self.node)


@dataclass(frozen=True)
class Component(ConfigNode):
    """A config group's choice as a read-only mapping of its node (``_target_``, ``name`` and
    the constructor's arguments); ``build`` instantiates it."""

    group: str
    node: Mapping[str, Any]

    @property
    def name(self) -> str | None:
        """The choice's label (``rope``, ``swiglu``); None for a node without one."""
        name = self.node.get("name")
        return None if name is None else str(name)

    def build(self, **kwargs: Any) -> Any:
        """The object the node describes (``config.instantiate``: one-line ``ConfigError``)."""
        from transformer_lab.config.instantiate import instantiate_component

        return instantiate_component(dict(self.node), self.group, **kwargs)


@dataclass(frozen=True)
class Dropout:
    """``model.dropout.*``: the rates on the embeddings, the attention probabilities, the FFN's
    hidden activation and each sublayer's output."""

    embedding: float = 0.0
    attention: float = 0.0
    ffn: float = 0.0
    residual: float = 0.0


@dataclass(frozen=True)
class ModelSpec:
    """The ``model.*`` keys (``configs/model/tiny.yaml`` says what each means), whether the model
    is a decoder (``arch.causal``) and its ``pe``, ``block``, ``norm_layer`` and ``ffn``."""

    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    max_len: int
    pe: Component
    block: Component
    norm_layer: Component
    ffn: Component
    causal: bool = False
    vocab_size: int | None = None  # None until the task gives it (``RunSpec.with_vocab``)
    attn_bias: bool = True
    ffn_bias: bool = True
    n_kv_heads: int | None = None
    head_dim: int | None = None
    attn_scale: float | None = None
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    tie_embeddings: bool = False
    embed_norm: bool = False
    parallel_block: bool = False
    gated_match_params: bool = False
    embed_scale: str | float | None = "sqrt"
    pe_scale: float = 1.0
    residual_scale: float = 1.0
    init_std: float = 0.02
    dropout: Dropout = field(default_factory=Dropout)

    def settings(self) -> dict[str, Any]:
        """The ``model.*`` keys as a plain dict (``dropout`` nested), without the components:
        what ``model.assemble_model`` and an exported model's ``config.json`` read."""
        values = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name not in (*COMPONENT_GROUPS, "causal")}
        values["dropout"] = dict(vars(self.dropout))
        return values

    def component(self, group: str) -> Component:
        """The component of ``group`` (one of ``COMPONENT_GROUPS``)."""
        return getattr(self, group)


@dataclass(frozen=True)
class RoutineSettings(ConfigNode):
    """``routine.*``: which routine runs (``name``) and its own keys (``node``), checked against
    its module's ``SETTINGS`` before the spec is built; read-only."""

    name: str
    node: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, key: str) -> Any:  # spec.routine.steps, as the YAML names it
        try:
            return self.__dict__["node"][key]
        except KeyError:
            raise AttributeError(f"routine.{key} is not a setting of routine "
                                 f"'{self.__dict__.get('name')}'") from None

    def replace(self, **values: Any) -> RoutineSettings:
        """These settings with ``values`` changed."""
        return RoutineSettings(self.name, {**self.node, **values})


@dataclass(frozen=True)
class OptimizerSettings:
    """One optimiser of the ``optimizer`` group; ``rest`` is the optimiser of the other parameters
    with ``params="hidden_matrices"``."""

    name: str
    target: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    params: str = "all"
    lr_ratio: float = 1.0
    rest: OptimizerSettings | None = None

    @classmethod
    def adamw(cls, betas: Sequence[float] = (0.9, 0.98),
              weight_decay: float = 0.0) -> OptimizerSettings:
        """tlab's default: ``torch.optim.AdamW``, fused where possible
        (``configs/optimizer/adamw.yaml``)."""
        return cls("adamw", "torch.optim.AdamW", {"betas": tuple(float(b) for b in betas),
                                                   "weight_decay": float(weight_decay),
                                                   "fused": True})


@dataclass(frozen=True)
class TrainSettings:
    """The ``train.*`` keys, typed (``configs/train/default.yaml`` says what each means), plus the
    width the ``noam`` schedule scales by and the optimiser."""

    d_model: int
    steps: int = 200
    batch_size: int = 64
    lr: float = 3e-3
    schedule: str = "constant"
    warmup: int = 0
    noam_factor: float = 1.0
    min_lr_ratio: float = 0.1
    grad_clip: float | None = 1.0
    log_every: int = 10
    eval_every: int = 0
    threads: int | None = 1
    checkpoint: bool = True  # tlab train keeps the resumable state (checkpoint.pt)
    checkpoint_every: int = 0  # resumable state every N steps (0: none); the caller saves it
    device: str = "cpu"  # auto | cpu | cuda | cuda:K (auto: cuda when torch sees one)
    precision: str = "fp32"
    compile: bool = False  # torch.compile the model's forward
    grad_accum: int = 1  # forwards of batch_size per optimiser step
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings.adamw)

    def __post_init__(self) -> None:
        """The keys ``SCHEMA`` types (the same lines as the pre-flight's; the schedule's name:
        ``training.schedules.schedule``)."""
        from transformer_lab.config.schema import SCHEMA

        for name in ("precision", "grad_accum", "compile", "threads"):
            SCHEMA[f"train.{name}"].check(f"train.{name}", getattr(self, name))

    @classmethod
    def from_mapping(cls, train: Mapping[str, object], d_model: int,
                     optimizer: OptimizerSettings | None = None) -> TrainSettings:
        """From the ``train`` node (unknown keys ignored); the optimiser defaults to AdamW with
        ``train.betas`` and ``train.weight_decay``."""
        known = {f.name for f in fields(cls)} - {"d_model", "optimizer"}
        values = {key: value for key, value in train.items() if key in known}
        if optimizer is None:
            betas, decay = train.get("betas", (0.9, 0.98)), train.get("weight_decay", 0.0)
            optimizer = OptimizerSettings.adamw(betas, decay)  # type: ignore[arg-type]
        return cls(d_model=int(d_model), optimizer=optimizer, **values)  # type: ignore[arg-type]


def user_train_fields() -> list[Any]:
    """The ``TrainSettings`` fields a user sets as ``train.*`` (the CLI's options, the Python
    API's keywords): all but the model's width and the optimiser (its own group)."""
    return [f for f in fields(TrainSettings) if f.name not in ("d_model", "optimizer")]


@dataclass(frozen=True)
class RunSpec:
    """One run: the model, the task, the training (with the optimiser), the routine and the
    seeds. ``source``: the composed config it was read from, kept for what only composition can
    do (a variant with another group choice: ``config.variants``; ``config.yaml``); code below
    the config layer does not read it."""

    model: ModelSpec
    task: Component
    train: TrainSettings
    routine: RoutineSettings
    seed: int = 0
    seed_init: int | None = None
    seed_data: int | None = None
    force: bool = False  # run even where the pre-flight estimates the run cannot fit
    from_hf: str | None = None  # start from a Hugging Face checkpoint's weights (--from-hf)
    from_run: str | None = None  # start from a tlab run's trained weights (--from-run)
    source: DictConfig | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, cfg: DictConfig) -> RunSpec:
        """The spec of a composed config (its checks have run: ``app.preflight.check_unbuilt``)."""
        from omegaconf import OmegaConf

        def node(key: str) -> dict[str, Any]:
            found = OmegaConf.select(cfg, key, default=None)
            return {} if found is None else OmegaConf.to_container(found, resolve=True)

        model = node("model")
        dropout = Dropout(**model.pop("dropout", {}) or {})
        components = {group: Component(group, node(group))
                      for group in COMPONENT_GROUPS}
        known = {f.name for f in fields(ModelSpec)}
        spec = ModelSpec(**{k: v for k, v in model.items() if k in known}, dropout=dropout,
                         causal=bool(OmegaConf.select(cfg, "arch.causal", default=False)),
                         **components)
        optimizer = node("optimizer")
        train = TrainSettings.from_mapping(node("train"), spec.d_model,
                                           optimizer_settings(optimizer) if optimizer else None)
        routine = node("routine")
        return cls(model=spec, task=Component("task", node("task")),
                   train=train,
                   routine=RoutineSettings(str(routine.pop("name", "")), routine),
                   seed=int(cfg.get("seed", 0)), seed_init=cfg.get("seed_init"),
                   seed_data=cfg.get("seed_data"), force=bool(cfg.get("force", False)),
                   from_hf=_text(cfg.get("from_hf")), from_run=_text(cfg.get("from_run")),
                   source=cfg)

    def resolved(self, seed: int | None = None) -> dict[str, Any]:
        """The resolved config the spec was read from (``hydra`` left out, the model's
        vocabulary the spec's): what a weights file's header keeps; with ``seed``, that of a
        model trained with that seed."""
        from omegaconf import OmegaConf

        cfg = self.source
        container = OmegaConf.to_container(
            OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
        container["model"]["vocab_size"] = self.model.vocab_size
        if seed is not None:
            container["seed"] = int(seed)
        return container

    def with_vocab(self, vocab_size: int) -> RunSpec:
        """This spec with the task's vocabulary size as the model's."""
        return replace(self, model=replace(self.model, vocab_size=int(vocab_size)))

    def seed_sources(self, seed: int) -> tuple[int, int]:
        """(initialisation seed, data-order seed) of the run's seed ``seed``: both ``seed`` unless
        ``seed_init`` / ``seed_data`` set one apart, which then moves by the same offset."""
        offset = seed - self.seed
        return (seed if self.seed_init is None else self.seed_init + offset,
                seed if self.seed_data is None else self.seed_data + offset)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def optimizer_settings(values: Mapping[str, Any]) -> OptimizerSettings:
    """An ``optimizer`` node's values: tlab's keys (``TLAB_KEYS``) read, the others the
    constructor's keywords (lists as tuples); ``rest`` in the same way."""
    rest = values.get("rest")
    return OptimizerSettings(
        name=str(values.get("name", values.get("_target_"))), target=str(values.get("_target_")),
        arguments={key: tuple(value) if isinstance(value, list) else value
                   for key, value in values.items() if key not in TLAB_KEYS},
        params=str(values.get("params", "all")), lr_ratio=float(values.get("lr_ratio", 1.0)),
        rest=None if rest is None else optimizer_settings(rest))
