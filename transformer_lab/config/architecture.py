"""Pre-flight checks that tie several architecture keys together (GQA heads, head size, parallel
block, YaRN's and Llama 3's bounds, MoE top_k); one key's type and range is ``schema``'s job."""

from __future__ import annotations

from omegaconf import DictConfig

from transformer_lab.config.knowledge import declared
from transformer_lab.errors import ConfigError


def check_architecture(cfg: DictConfig) -> None:
    """Raise ``ConfigError`` for the first inconsistent combination of knobs in ``cfg``."""
    _check_heads(cfg.model)
    _check_parallel_block(cfg)
    _check_rope(cfg.pe)
    _check_moe(cfg.ffn)


def _check_heads(m: DictConfig) -> None:
    head_dim, n_kv_heads = m.get("head_dim"), m.get("n_kv_heads")
    if head_dim is None and m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by "
                          f"model.n_heads={m.n_heads} (or set model.head_dim)")
    if n_kv_heads is not None and (n_kv_heads > m.n_heads or m.n_heads % n_kv_heads):
        divisors = [k for k in range(1, m.n_heads + 1) if m.n_heads % k == 0]
        raise ConfigError(f"model.n_kv_heads={n_kv_heads} is not valid; it must divide "
                          f"model.n_heads={m.n_heads}: one of {', '.join(map(str, divisors))} "
                          f"or null")


def _check_parallel_block(cfg: DictConfig) -> None:
    if cfg.model.get("parallel_block") and declared(cfg.block, "supports_parallel") is not True:
        raise ConfigError(f"model.parallel_block=true is not valid with "
                          f"block={cfg.block.get('name')}; it needs block=pre")


def _check_rope(pe: DictConfig) -> None:
    if "beta_fast" in pe and "beta_slow" in pe and pe.beta_fast <= pe.beta_slow:
        raise ConfigError(f"pe.beta_fast={pe.beta_fast} is not valid with "
                          f"pe.beta_slow={pe.beta_slow}; it must be larger (YaRN: 32 and 1)")
    if "low_freq_factor" in pe and "high_freq_factor" in pe \
            and pe.high_freq_factor <= pe.low_freq_factor:
        raise ConfigError(f"pe.high_freq_factor={pe.high_freq_factor} is not valid with "
                          f"pe.low_freq_factor={pe.low_freq_factor}; it must be larger "
                          f"(Llama 3.1: 4 and 1)")
    if pe.get("scaling") in ("llama3", "yarn", "dynamic") and pe.get("original_max_len") is None:
        raise ConfigError(f"pe.scaling={pe.scaling} needs pe.original_max_len (the trained "
                          f"context length, a positive integer)")


def _check_moe(ffn: DictConfig) -> None:
    if "n_experts" in ffn and "top_k" in ffn and ffn.top_k > ffn.n_experts:
        raise ConfigError(f"ffn.top_k={ffn.top_k} is not valid; it must be in "
                          f"[1, ffn.n_experts={ffn.n_experts}]")
