"""``TrainSettings`` (the ``train.*`` keys) and ``OptimizerSettings`` (the ``optimizer`` group),
typed and checked once; no torch here, so the command line can read the fields."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from transformer_lab.errors import ConfigError
from transformer_lab.training.schedules import SCHEDULES


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
        """The keys ``SCHEMA`` types (the same lines as the pre-flight's), then the schedule."""
        from transformer_lab.config.schema import SCHEMA  # omegaconf: not at the CLI's start-up

        for name in ("precision", "grad_accum", "compile", "threads"):
            SCHEMA[f"train.{name}"].check(f"train.{name}", getattr(self, name))
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train.schedule='{self.schedule}' is not known; valid: "
                              f"{', '.join(SCHEDULES)}")

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
