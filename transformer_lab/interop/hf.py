"""Hugging Face ``transformers`` models in and out of tlab (the optional extra ``hf``).

    from_hf(model_or_local_dir) -> (cfg, model)   a tlab config (preset + knobs) and the
                                                  TransformerModel holding the same weights
    to_hf(model, cfg) -> transformers model       the other way

Offline by design: a directory is read with ``local_files_only=True``, never downloaded. A
checkpoint using something tlab cannot express is refused with ``ConfigError`` (exit code 2)
naming it. Families: ``hf_families.FAMILIES`` (model_type -> preset).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from transformer_lab.config.compose import compose
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf_families import FAMILIES, Family, Unsupported
from transformer_lab.model import TransformerModel, build_model

MISSING = "transformers is not installed (pip install 'transformer_lab[hf]')"


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError(MISSING) from None
    return transformers


def _family(model_type: str) -> Family:
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type={model_type!r} is not supported by tlab's interop; "
                          f"valid: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def load_hf(model_or_dir: Any) -> Any:
    """A ``transformers`` model, or one loaded from a local directory (never downloaded)."""
    transformers = _transformers()
    if not isinstance(model_or_dir, str | Path):
        return model_or_dir
    path = Path(model_or_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(f"--from-hf {path} is not a local Hugging Face model directory "
                          f"(no config.json; tlab reads local directories only)")
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    family = _family(config.model_type)
    cls = getattr(transformers, family.hf_class)
    return cls.from_pretrained(path, local_files_only=True, dtype="float32")


def hf_overrides(model_or_dir: Any) -> list[str]:
    """The tlab overrides that describe a checkpoint (a preset plus the knob values)."""
    hf = load_hf(model_or_dir)
    try:
        return _family(hf.config.model_type).overrides(hf.config)
    except Unsupported as exc:
        raise ConfigError(f"this checkpoint uses {exc}, which tlab cannot express") from None


def load_hf_weights(model: TransformerModel, cfg: DictConfig, model_or_dir: Any) -> None:
    """Copy a checkpoint's weights into ``model`` (built from ``cfg`` with ``hf_overrides``).
    The token embedding and output head keep the first ``model.vocab_size`` rows when the
    task's vocabulary is smaller than the checkpoint's."""
    hf = load_hf(model_or_dir)
    family = _family(hf.config.model_type)
    state = family.to_tlab(hf.config, hf.state_dict())
    own = model.state_dict()
    for name in ("token_embedding.weight", "lm_head.weight"):
        if name in state and name in own and state[name].shape[0] > own[name].shape[0]:
            state[name] = state[name][: own[name].shape[0]]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.model.tie_embeddings)]
    if missing or unexpected:
        raise ConfigError(f"the checkpoint does not fit tlab's model: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")


def from_hf(model_or_dir: Any, overrides: list[str] | tuple[str, ...] = ()
            ) -> tuple[DictConfig, TransformerModel]:
    """(cfg, model): the tlab config of a ``transformers`` model (or local directory) and a
    tlab model with its weights; tokens (B, T) -> logits (B, T, vocab), or the final hidden
    states (B, T, D) for a model without an output head."""
    hf = load_hf(model_or_dir)
    cfg = compose([*hf_overrides(hf), *overrides])
    cfg.model.vocab_size = hf.config.vocab_size
    model = build_model(cfg, seed=0)
    family = _family(hf.config.model_type)
    model.output_head = family.output_head
    load_hf_weights(model, cfg, hf)
    return cfg, model.eval()


def to_hf(model: TransformerModel, cfg: DictConfig) -> Any:
    """A ``transformers`` model with ``model``'s weights, for a config of a preset family."""
    transformers = _transformers()
    preset = cfg.get("preset_name") or _preset_of(cfg)
    family = next((f for f in FAMILIES.values() if f.preset == preset), None)
    if family is None:
        known = sorted({f.preset for f in FAMILIES.values()})
        raise ConfigError(f"to_hf knows the families {known}; this config is not one of them")
    hf_config = family.hf_config(cfg)
    hf = getattr(transformers, family.hf_class)(hf_config).eval()
    state = family.to_hf(cfg, model.state_dict())
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and cfg.model.tie_embeddings)]
    if missing or unexpected:
        raise ConfigError(f"tlab's model does not fit {family.hf_class}: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")
    return hf


def _preset_of(cfg: DictConfig) -> str:
    """Which family a config belongs to, from its components (llama-like or mixtral)."""
    if cfg.ffn.get("name") == "moe":
        return "mixtral"
    if cfg.ffn.get("name") == "swiglu" and cfg.norm_layer.get("name") == "rmsnorm":
        return "llama"
    return "unknown"
