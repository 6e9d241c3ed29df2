"""Pre-flight checks that tie several architecture keys together (GQA heads, head size, parallel
block, YaRN's and Llama 3's bounds, MoE top_k); one key's type and range is ``schema``'s job."""

from __future__ import annotations

from transformer_lab.config.knowledge import declared
from transformer_lab.config.spec import ModelSpec
from transformer_lab.errors import ConfigError


def check_architecture(m: ModelSpec) -> None:
    """Raise ``ConfigError`` for the first inconsistent combination of knobs in ``m``."""
    pe, ffn = m.pe, m.ffn
    head_dim, n_kv_heads = m.head_dim, m.n_kv_heads
    if head_dim is None and m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model={m.d_model} is not divisible by "
                          f"model.n_heads={m.n_heads} (or set model.head_dim)")
    if n_kv_heads is not None and (n_kv_heads > m.n_heads or m.n_heads % n_kv_heads):
        divisors = [k for k in range(1, m.n_heads + 1) if m.n_heads % k == 0]
        raise ConfigError(f"model.n_kv_heads={n_kv_heads} is not valid; it must divide "
                          f"model.n_heads={m.n_heads}: one of {', '.join(map(str, divisors))} "
                          f"or null")
    if m.parallel_block and declared(m.block, "supports_parallel") is not True:
        raise ConfigError(f"model.parallel_block=true is not valid with "
                          f"block={m.block.name}; it needs block=pre")
    for high, low, usual in (("beta_fast", "beta_slow", "YaRN: 32 and 1"),
                             ("high_freq_factor", "low_freq_factor", "Llama 3.1: 4 and 1")):
        if high in pe and low in pe and pe[high] <= pe[low]:
            raise ConfigError(f"pe.{high}={pe[high]} is not valid with pe.{low}={pe[low]}; it "
                              f"must be larger ({usual})")
    if pe.get("scaling") in ("llama3", "yarn", "dynamic") and pe.get("original_max_len") is None:
        raise ConfigError(f"pe.scaling={pe['scaling']} needs pe.original_max_len (the trained "
                          f"context length, a positive integer)")
    if "n_experts" in ffn and "top_k" in ffn and ffn["top_k"] > ffn["n_experts"]:
        raise ConfigError(f"ffn.top_k={ffn['top_k']} is not valid; it must be in "
                          f"[1, ffn.n_experts={ffn['n_experts']}]")
