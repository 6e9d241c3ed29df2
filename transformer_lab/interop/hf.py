"""Hugging Face ``transformers`` models in and out of tlab (extra ``hf``): ``from_hf`` ->
(ModelSpec, TransformerModel), ``to_hf`` back. Local directories only (``local_files_only``); a
setting tlab cannot express is a ``ConfigError`` naming it. Families: ``hf_families.FAMILIES``."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from torch import nn

from transformer_lab.config.compose import compose
from transformer_lab.config.spec import ModelSpec, RunSpec
from transformer_lab.errors import ConfigError
from transformer_lab.interop.hf_families import FAMILIES, Family, Unsupported
from transformer_lab.model import TransformerModel, build_model


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise ConfigError("transformers is not installed (pip install 'transformer_lab[hf]')"
                          ) from None
    return transformers


def _family(model_type: str) -> Family:
    if model_type not in FAMILIES:
        raise ConfigError(f"model_type={model_type!r} is not supported by tlab's interop; "
                          f"valid: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def hf_config(model_or_dir: Any) -> Any:
    """The ``transformers`` config of a model, or of a local directory's config.json
    (no weights read)."""
    transformers = _transformers()
    if not isinstance(model_or_dir, str | Path):
        return model_or_dir.config
    path = Path(model_or_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(f"--from-hf {path} is not a local Hugging Face model directory "
                          f"(no config.json; tlab reads local directories only)")
    try:
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True,
                                                       trust_remote_code=False)
    except (ValueError, OSError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"--from-hf {path}: its config.json cannot be read: {first}") from None


def load_hf(model_or_dir: Any) -> Any:
    """A ``transformers`` model, or one loaded from a local directory (never downloaded)."""
    if not isinstance(model_or_dir, str | Path):
        return model_or_dir
    return _load_dir(str(Path(model_or_dir).resolve()))


@lru_cache(maxsize=1)
def _load_dir(path: str) -> Any:
    """The model saved in ``path``, loaded once per process (pre-flight and the routine)."""
    family = _family(hf_config(path).model_type)
    transformers = _transformers()
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar in tlab's output
    cls = getattr(transformers, family.hf_class)
    try:
        # weights as safetensors only (a pickled pytorch_model.bin is code); no remote code
        return cls.from_pretrained(path, local_files_only=True, dtype="float32",
                                   use_safetensors=True, trust_remote_code=False).eval()
    except (OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"--from-hf {path}: the weights cannot be loaded: {first}") from None


def hf_overrides(model_or_dir: Any) -> list[str]:
    """The tlab overrides (a preset plus knob values) that describe a checkpoint."""
    config = hf_config(model_or_dir)
    try:
        return _family(config.model_type).overrides(config)
    except Unsupported as exc:
        raise ConfigError(f"this checkpoint uses {exc}, which tlab cannot express") from None


def load_hf_weights(model: TransformerModel, spec: ModelSpec, model_or_dir: Any) -> None:
    """Copy a checkpoint's weights into ``model`` (``spec``'s, built with ``hf_overrides``), the
    vocabulary cut to the task's."""
    hf = load_hf(model_or_dir)
    family = _family(hf.config.model_type)
    headless = spec.tie_embeddings or not family.output_head  # lm_head: tied, or none
    load_fitted(model, family.to_tlab(hf.config, hf.state_dict()), "the checkpoint",
                may_miss=("lm_head.weight",) if headless else ())


def load_fitted(model: nn.Module, state: dict[str, Any], source: str,
                may_miss: tuple[str, ...] = ()) -> None:
    """Load ``state`` into ``model``, its embedding and head cut to the model's first rows;
    ``ConfigError`` for a larger vocabulary than the checkpoint's, naming the first tensor of
    another shape, or those missing (but ``may_miss``) or unexpected."""
    own = model.state_dict()
    for name in ("token_embedding.weight", "lm_head.weight"):
        if name in state and name in own:
            rows, theirs = own[name].shape[0], state[name].shape[0]
            if rows > theirs:
                raise ConfigError(f"the task's vocabulary ({rows} tokens) is larger than the "
                                  f"checkpoint's ({theirs}); use a task with at most {theirs} "
                                  "tokens (e.g. task.tokenizer=char)")
            state[name] = state[name][:rows]
    wrong = [k for k, v in state.items() if k in own and v.shape != own[k].shape]
    if wrong:
        raise ConfigError(f"{source} does not fit the model built here: {wrong[0]} is "
                          f"{tuple(state[wrong[0]].shape)} there, {tuple(own[wrong[0]].shape)} "
                          "here (an override changed the model's sizes?)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in may_miss]
    if missing or unexpected:
        raise ConfigError(f"{source} does not fit the model built here: missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]}")


def composed_model(overrides: list[str]) -> ModelSpec:
    """The model tlab's config tree composes with ``overrides``."""
    return RunSpec.of(compose(overrides)).model


def from_hf(model_or_dir: Any, overrides: list[str] | tuple[str, ...] = ()
            ) -> tuple[ModelSpec, TransformerModel]:
    """(spec, model): the tlab model spec of a ``transformers`` model (or local directory) and a
    tlab model with its weights: tokens (B, T) -> logits (B, T, vocab), or hidden states (B, T, D)
    without an output head."""
    hf = load_hf(model_or_dir)
    family = _family(hf.config.model_type)
    spec = replace(composed_model([*hf_overrides(hf), *overrides]),
                   vocab_size=hf.config.vocab_size)
    model = build_model(spec, seed=0)
    model.output_head = family.output_head
    load_hf_weights(model, spec, hf)
    return spec, model.eval()


def to_hf(model: TransformerModel, spec: ModelSpec) -> Any:
    """A ``transformers`` model with ``model``'s weights, for a model of a preset family."""
    transformers = _transformers()
    preset = preset_of(spec)
    family = next((f for f in FAMILIES.values() if f.preset == preset), None)
    if family is None:
        known = sorted({f.preset for f in FAMILIES.values()})
        raise ConfigError(f"to_hf knows the families {known}; this config is not one of them")
    config = family.hf_config(spec)
    hf = getattr(transformers, family.hf_class)(config, **dict(family.hf_init)).eval()
    load_fitted(hf, family.to_hf(spec, model.state_dict()), f"tlab's {family.hf_class} weights",
                may_miss=("lm_head.weight",) if spec.tie_embeddings else ())
    return hf


def preset_of(spec: ModelSpec) -> str:
    """Which family a model's components belong to."""
    ffn, norm, pe = (spec.component(group).name for group in ("ffn", "norm_layer", "pe"))
    if pe == "alibi":
        return "bloom"
    if ffn == "moe":
        return "mixtral"
    if ffn == "swiglu" and norm == "rmsnorm":
        return "llama"
    if pe == "t5":
        return "t5_encoder"
    if pe == "learned":
        return "bert" if spec.embed_norm else "gpt2"
    if pe == "rope" and norm == "layernorm":
        return "gpt_neox"
    return "unknown"
