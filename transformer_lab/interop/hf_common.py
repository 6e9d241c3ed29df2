"""What the family maps of :mod:`.hf_families` share: ``Family``, ``Unsupported`` and helpers over
state dicts (``{name: tensor}``, linear weights ``(out, in)``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

State = dict[str, torch.Tensor]


COMPONENTS = ("pe", "ffn", "block", "norm_layer")  # the groups a run chooses components in

class Unsupported(ValueError):
    """A checkpoint setting tlab cannot express."""


@dataclass(frozen=True)
class Family:
    """How one ``model_type`` maps onto tlab."""

    preset: str
    hf_class: str  # the transformers class ``to_hf`` builds and ``from_hf`` loads
    overrides: Callable[[Any], list[str]]
    to_tlab: Callable[[Any, State], State]
    to_hf: Callable[[Any, State], State]
    hf_config: Callable[[Any], Any]
    output_head: bool = True  # False: the HF model returns hidden states (BertModel, T5 encoder)
    hf_init: tuple[tuple[str, Any], ...] = ()  # keywords of ``hf_class(config, ...)`` in to_hf


def require(hc: Any, key: str, allowed: tuple, default: Any = None) -> None:
    """Raise ``Unsupported`` unless the config's ``key`` is one of ``allowed``."""
    value = getattr(hc, key, default)
    if value not in allowed:
        raise Unsupported(f"{key}={value!r} (tlab supports {', '.join(map(repr, allowed))})")


def layers(cfg_or_hc: Any, key: str = "num_hidden_layers") -> range:
    """``range(L)`` of a ``transformers`` config (its ``key``) or a tlab config."""
    n = getattr(cfg_or_hc, key, None)
    return range(n if n is not None else cfg_or_hc.model.n_layers)


def rename(state: State, pairs: list[tuple[str, str]]) -> State:
    """``{new: state[old]}`` for each ``(old, new)`` pair whose ``old`` is in ``state``."""
    return {new: state[old] for old, new in pairs if old in state}


def swapped(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The same name pairs the other way round."""
    return [(b, a) for a, b in pairs]


def ffn_choice(act: str, names: dict[str, str], key: str) -> str:
    """The tlab ``ffn`` choice of a HF activation name; ``Unsupported`` for another."""
    if act not in names:
        raise Unsupported(f"{key}={act!r} (tlab supports {', '.join(map(repr, names))})")
    return names[act]


def flag(name: str, value: Any) -> str:
    """``model.x=true``: an override with a lower-case boolean."""
    return f"{name}={str(bool(value)).lower()}"


def rope_overrides(hc: Any) -> list[str]:
    """``rope_parameters`` (transformers >= 5) or ``rope_theta`` + ``rope_scaling`` -> pe.*."""
    params = dict(getattr(hc, "rope_parameters", None) or {})
    params.update(getattr(hc, "rope_scaling", None) or {})
    base = params.get("rope_theta", getattr(hc, "rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    names = {"default": "none", "linear": "linear", "dynamic": "dynamic", "yarn": "yarn",
             "llama3": "llama3"}
    if kind not in names:
        raise Unsupported(f"rope_type={kind!r} (tlab supports {', '.join(names)})")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key):
            raise Unsupported(f"rope {key}={params[key]!r} (tlab: attention_factor only)")
    if params.get("truncate") is False:
        raise Unsupported("rope truncate=False (tlab rounds YaRN's ramp bounds)")
    out = [f"pe.base={float(base)}", f"pe.scaling={names[kind]}",
           f"pe.rotary_fraction={float(params.get('partial_rotary_factor', 1.0))}"]
    if kind != "default":
        out.append(f"pe.factor={float(params['factor'])}")
    original = params.get("original_max_position_embeddings")
    if kind == "dynamic":  # transformers' dynamic NTK starts past max_position_embeddings
        original = hc.max_position_embeddings
    if original is not None:
        out.append(f"pe.original_max_len={int(original)}")
    for key in ("beta_fast", "beta_slow", "attention_factor", "low_freq_factor",
                "high_freq_factor"):
        if params.get(key) is not None:
            out.append(f"pe.{key}={float(params[key])}")
    return out


def max_positions(cfg: Any) -> int:
    """HF ``max_position_embeddings`` of a tlab config: ``pe.original_max_len`` under dynamic NTK
    (transformers' starts past it), else ``model.max_len``."""
    return cfg.pe.original_max_len if cfg.pe.scaling == "dynamic" else cfg.model.max_len


def rope_parameters(cfg: Any) -> dict:
    """tlab's RoPE settings (``cfg.pe``) as HF ``rope_parameters``."""
    pe = cfg.pe
    kind = {"none": "default"}.get(pe.scaling, pe.scaling)
    params = {"rope_type": kind, "rope_theta": float(pe.base)}
    if pe.get("rotary_fraction", 1.0) != 1.0:
        params["partial_rotary_factor"] = float(pe.rotary_fraction)
    if kind != "default":
        params["factor"] = float(pe.factor)
    if pe.scaling in ("yarn", "llama3") and pe.original_max_len is not None:
        params["original_max_position_embeddings"] = int(pe.original_max_len)
    if pe.scaling == "yarn":
        params.update(beta_fast=float(pe.beta_fast), beta_slow=float(pe.beta_slow))
        if pe.attention_factor is not None:
            params["attention_factor"] = float(pe.attention_factor)
    if pe.scaling == "llama3":
        params.update(low_freq_factor=float(pe.low_freq_factor),
                      high_freq_factor=float(pe.high_freq_factor))
    return params
