"""What a run keeps of the models it trains and how they come back: final weights as safetensors
with the config that rebuilds them in the header (docs/export.md), and the resumable state of
``tlab train`` (``checkpoint.pt``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn

from transformer_lab.config.registry import check_saved_config, user_components
from transformer_lab.config.spec import RunSpec
from transformer_lab.data.corpus import atomic_write
from transformer_lab.data.tokenizer import Tokenizer, tokenizer_from_spec, tokenizer_spec
from transformer_lab.errors import ConfigError
from transformer_lab.model import TransformerModel, build_model
from transformer_lab.results.run_directory import MODELS_DIR, WEIGHTS_FILE

WEIGHTS_FORMAT = "1"  # the header's ``tlab_format``
STATE_FORMAT = 1  # the resumable state's ``format``


def config_yaml(spec: RunSpec, seed: int | None = None) -> str:
    """The resolved config ``spec`` was read from (``hydra`` left out, the model's vocabulary the
    spec's) as YAML; with ``seed``, that of a model trained with that seed."""
    return OmegaConf.to_yaml(OmegaConf.create(spec.resolved(seed)))


def save_weights(model: nn.Module, path: Path, spec: RunSpec, seed: int, index: int = 0,
                 variant: str | None = None, varied: str | None = None,
                 tokenizer: Tokenizer | None = None) -> Path:
    """Write ``model``'s whole ``state_dict`` (tied tensors once) with its header (the config of
    ``spec``), atomically."""
    from safetensors.torch import save_model

    config = spec.resolved(seed)
    metadata = {"tlab_format": WEIGHTS_FORMAT,
                "config": OmegaConf.to_yaml(OmegaConf.create(config)),
                "seed": str(int(seed)), "index": str(int(index))}
    if variant is not None:
        metadata.update(variant=str(variant), varied=str(varied or ""))
    if components := user_components(config):  # what --trust-code may import when it loads
        metadata["components"] = json.dumps(components)
    if (described := tokenizer_spec(tokenizer)) is not None:
        metadata["tokenizer"] = described
    return atomic_write(path, lambda temporary: save_model(model, temporary, metadata,
                                                           force_contiguous=True))


@dataclass(frozen=True)
class WeightsHeader:
    """What a weights file says about its model (``save_weights``)."""

    path: Path
    spec: RunSpec  # the run's, with the model's vocabulary
    seed: int
    index: int
    variant: str | None
    varied: str | None
    tokenizer_spec: str | None

    @property
    def name(self) -> str:
        """The model in words: ``seed 0``, ``variant alibi, seed 1``."""
        return (f"variant {self.variant}, " if self.variant is not None else "") + \
            f"seed {self.seed}"


def read_header(path: Path) -> WeightsHeader:
    """The header of a weights file; ``ConfigError`` (one line) for a file that is not one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as file:
            metadata = file.metadata() or {}
    except Exception as exc:
        raise ConfigError(f"{path} is not a readable safetensors file ({type(exc).__name__})"
                          ) from None
    if metadata.get("tlab_format") != WEIGHTS_FORMAT or "config" not in metadata:
        raise ConfigError(f"{path} holds no tlab model (no tlab_format {WEIGHTS_FORMAT} header); "
                          "give a file a tlab run wrote")
    # the header is data from elsewhere: parsed, then checked by name before anything builds
    try:
        cfg = OmegaConf.create(metadata["config"])
        recorded = json.loads(metadata.get("components", "[]"))
        seed, index = int(metadata["seed"]), int(metadata.get("index", 0))
    except Exception as exc:
        raise ConfigError(f"{path}: its header cannot be read ({type(exc).__name__})") from None
    if not isinstance(cfg, DictConfig) or not isinstance(recorded, list):
        raise ConfigError(f"{path}: its header's config is not a tlab config")
    check_saved_config(cfg, f"{path} (its header's config)", [str(r) for r in recorded])
    try:
        spec = RunSpec.of(cfg)
    except (TypeError, AttributeError, KeyError) as exc:  # a key missing or misshapen
        raise ConfigError(f"{path}: its header's config is not a tlab config "
                          f"({type(exc).__name__})") from None
    return WeightsHeader(path, spec, seed, index, metadata.get("variant"),
                         metadata.get("varied"), metadata.get("tokenizer"))


@dataclass
class TrainedModel:
    """A trained model back from its weights file: eval mode, on the CPU."""

    header: WeightsHeader
    model: TransformerModel
    tokenizer: Tokenizer | None

    @property
    def spec(self) -> RunSpec:
        return self.header.spec


def load_trained(path: Path) -> TrainedModel:
    """Rebuild the model of a weights file from its header's config and load its weights
    (``ConfigError`` when a tensor does not fit)."""
    from safetensors.torch import load_model

    header = read_header(path)
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        model = build_model(header.spec.model, seed=header.seed)
    try:
        load_model(model, str(path), strict=True, device="cpu")
    except RuntimeError as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"{path}: the weights do not fit the model its config builds: "
                          f"{first}") from None
    return TrainedModel(header, model.eval(), tokenizer_from_spec(header.tokenizer_spec))


def run_weights(run_dir: Path) -> list[WeightsHeader]:
    """The headers of every weights file of a run, in the order the run trained them."""
    files = [run_dir / WEIGHTS_FILE] if (run_dir / WEIGHTS_FILE).is_file() else []
    files += sorted((run_dir / MODELS_DIR).rglob("*.safetensors"))
    return sorted((read_header(f) for f in files), key=lambda h: (h.index, str(h.path)))


def choose_model(path: Path, variant: str | None = None, seed: int | None = None,
                 option: str = "") -> tuple[WeightsHeader, list[WeightsHeader]]:
    """(the weights file a command works on, every model of the run): ``path`` is a file, or a run
    directory narrowed to ``variant`` and ``seed`` (the first left). ``ConfigError`` names the valid
    values; ``option`` is how the command names ``path``."""
    where = f"{option} {path}".strip()
    if path.is_file():
        header = read_header(path)
        return header, [header]
    if not path.is_dir():
        raise ConfigError(f"{where}: no such run directory or weights file")
    models = run_weights(path)
    if not models:
        raise ConfigError(f"{where} holds no trained model ({WEIGHTS_FILE} or {MODELS_DIR}/); "
                          "runs of tlab train and tlab compare keep their final weights there")
    chosen = [h for h in models if (variant is None or h.variant == variant)
              and (seed is None or h.seed == seed)]
    if not chosen:
        variants = sorted({h.variant for h in models if h.variant is not None})
        valid = (f"variants {', '.join(variants)}; " if variants else "") + \
            f"seeds {', '.join(map(str, sorted({h.seed for h in models})))}"
        asked = [f"{k} {v}" for k, v in (("variant", variant), ("seed", seed)) if v is not None]
        raise ConfigError(f"{where} has no model of {', '.join(asked)}; valid: {valid}")
    return chosen[0], models


def save_state(path: Path, state: dict[str, Any]) -> Path:
    """Write a run's resumable state (tensors, numbers, strings, lists and dicts of them)
    atomically."""
    return atomic_write(path, lambda temporary: torch.save({"format": STATE_FORMAT, **state},
                                                           temporary))


def load_state(path: Path) -> dict[str, Any]:
    """The state ``save_state`` wrote (``weights_only``: data only); ``ConfigError`` for an
    unreadable file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"{path} cannot be read as a tlab checkpoint ({type(exc).__name__}); "
                          "it may be damaged") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ConfigError(f"{path} is not a tlab checkpoint of format {STATE_FORMAT}")
    return state
