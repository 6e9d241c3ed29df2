"""The positional-encoding protocol: a PE's ``kind`` (none, additive, rotary, bias) says where
position enters the model and fixes ``forward``'s signature (docs/custom_components.md)."""

from __future__ import annotations

import inspect

from torch import nn

PE_KINDS: tuple[str, ...] = ("none", "additive", "rotary", "bias")

# kind -> (positional arguments forward must accept, human-readable signature)
_FORWARD_SIGNATURES: dict[str, tuple[int, str]] = {
    "additive": (1, "forward(positions) -> Tensor[T, d_model]"),
    "rotary": (3, "forward(q, k, positions) -> (q, k)"),
    "bias": (2, "forward(q_len, k_len) -> Tensor[H, q_len, k_len]"),
}


def query_offset(q_len: int, k_len: int) -> int:
    """Position of a bias PE's first query: the queries are the last ``q_len`` of the ``k_len``
    positions."""
    if not 0 <= q_len <= k_len:
        raise ValueError(f"q_len={q_len} is not valid for k_len={k_len}: the queries are the "
                         f"last q_len of the k_len positions, 0 <= q_len <= k_len")
    return k_len - q_len


def check_positional_module(module: object) -> None:
    """``TypeError`` naming the class, its ``kind`` and the valid kinds (and the missing method's
    signature) when ``module`` does not follow the protocol."""
    name, valid = type(module).__name__, ", ".join(repr(k) for k in PE_KINDS)
    if not isinstance(module, nn.Module):
        raise TypeError(f"positional encoding {name} is not a torch.nn.Module")

    kind = getattr(module, "kind", None)
    if kind is None:
        raise TypeError(f"positional encoding {name} has no class attribute `kind`; set it to "
                        f"one of {valid}")
    if kind not in PE_KINDS:
        raise TypeError(f"positional encoding {name} has kind={kind!r}, which is not valid; "
                        f"choose one of {valid}")
    if kind == "none":
        return
    n_args, signature = _FORWARD_SIGNATURES[kind]
    if type(module).forward is nn.Module.forward:
        raise TypeError(f"positional encoding {name} (kind={kind!r}) lacks the method "
                        f"{signature}; valid kinds are {valid}")
    try:
        inspect.signature(module.forward).bind(*([None] * n_args))
    except TypeError as err:
        raise TypeError(
            f"positional encoding {name} (kind={kind!r}) must define {signature}, but its "
            f"forward is forward{inspect.signature(module.forward)}; valid kinds are {valid}"
        ) from err
    except ValueError:  # signature not introspectable (C extension): trust it
        return
