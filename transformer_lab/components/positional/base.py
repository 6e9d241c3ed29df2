"""The positional-encoding protocol: how a PE plugs into a `tlab` model.

Every positional encoding is an ``nn.Module`` with a class attribute ``kind`` that tells the
model *where* position enters the computation. Constructor arguments come from the Hydra config
(``hydra.utils.instantiate``), so they are keyword arguments only.

======== ======================================== =============================================
kind     what the model calls                     what it does with the result
======== ======================================== =============================================
none     nothing                                  nothing (a position-free model: "NoPE")
additive ``pe(positions)``                        ``x = tok_emb * emb_scale + pe_scale * pe``
         ``positions: LongTensor[T]``
         returns ``Tensor[T, d_model]``
rotary   ``pe(q, k, positions)``                  attention uses the returned q, k
         ``q, k: Tensor[B, H, T, Dh]``,
         ``positions: LongTensor[T]``
         returns ``(q, k)``, same shapes
bias     ``pe(q_len, k_len)``                     added to every layer's attention logits
         returns ``Tensor[H, q_len, k_len]``      (computed once per forward, shared by layers)
======== ======================================== =============================================

Positions after an offset (cached decoding). A decoder with a KV cache runs the new tokens
only, at positions ``offset .. offset + T - 1`` (``offset`` = tokens already cached), so a PE
must use what it is given, never ``arange`` of its input's length:

* ``additive``: ``positions`` is ``arange(offset, offset + T)``: return the rows of those
  positions.
* ``rotary``: the model calls it twice per step, on tensors of one length each: the new queries
  at their positions (``pe(q, q, arange(offset, offset + T))[0]``) and every key, cached before
  rotation, at its own (``pe(k, k, arange(offset + T))[1]``). Rotate by ``positions``; a
  length-dependent scaling (dynamic NTK) must follow ``max(positions) + 1``, the sequence's
  length, not ``T``.
* ``bias``: the queries are the *last* ``q_len`` of the ``k_len`` positions: query ``i`` sits
  at position ``k_len - q_len + i`` and key ``j`` at ``j`` (:func:`query_offset`); in a full
  forward ``q_len == k_len`` and query ``i`` is at ``i``. ``bias[h, i, j]`` is added to
  ``q_i . k_j`` of head ``h`` before the softmax; ``-inf`` entries mask a key out. Returning the
  first ``q_len`` rows instead (top-left) is the bug of PyTorch #108108.

Step 1's ``cached_decoding`` (``measures/cached_decoding.py``) compares decoding with a cache
against the full forward and names the first position where they differ.

Writing your own PE: subclass ``nn.Module``, set ``kind``, implement ``forward`` with the
signature of the table above, and point a Hydra config at it with ``_target_``. The model calls
:func:`check_positional_module` on it and refuses (``TypeError``) a module that does not follow
the protocol. Minimal example::

    class MyBias(nn.Module):
        kind = "bias"

        def __init__(self, n_heads: int) -> None:
            super().__init__()
            self.n_heads = n_heads

        def forward(self, q_len: int, k_len: int) -> torch.Tensor:
            i = torch.arange(k_len - q_len, k_len)[:, None]      # (Tq, 1): the last positions
            j = torch.arange(k_len)[None, :]                     # (1, Tk)
            dist = (i - j).abs().float()                         # (Tq, Tk)
            return -dist.expand(self.n_heads, q_len, k_len)      # (H, Tq, Tk)
"""

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
    positions, so ``k_len - q_len`` (0 in a full forward)."""
    if not 0 <= q_len <= k_len:
        raise ValueError(f"q_len={q_len} is not valid for k_len={k_len}: the queries are the "
                         f"last q_len of the k_len positions, 0 <= q_len <= k_len")
    return k_len - q_len


def _valid_kinds() -> str:
    return ", ".join(repr(k) for k in PE_KINDS)


def check_positional_module(module: object) -> None:
    """Check that ``module`` follows the positional-encoding protocol (see the module docstring).

    Raises:
        TypeError: naming the class, its ``kind``, the valid kinds and, where that is what is
            wrong, the method (with its expected signature) that the class lacks.
    """
    name = type(module).__name__
    if not isinstance(module, nn.Module):
        raise TypeError(f"positional encoding {name} is not a torch.nn.Module")

    kind = getattr(module, "kind", None)
    if kind is None:
        raise TypeError(
            f"positional encoding {name} has no class attribute `kind`; "
            f"set it to one of {_valid_kinds()}"
        )
    if kind not in PE_KINDS:
        raise TypeError(
            f"positional encoding {name} has kind={kind!r}, which is not valid; "
            f"choose one of {_valid_kinds()}"
        )
    if kind == "none":
        return

    n_args, signature = _FORWARD_SIGNATURES[kind]
    if type(module).forward is nn.Module.forward:
        raise TypeError(
            f"positional encoding {name} (kind={kind!r}) lacks the method {signature}; "
            f"valid kinds are {_valid_kinds()}"
        )
    try:
        inspect.signature(module.forward).bind(*([None] * n_args))
    except TypeError as err:
        params = inspect.signature(module.forward)
        raise TypeError(
            f"positional encoding {name} (kind={kind!r}) must define {signature}, "
            f"but its forward is forward{params}; valid kinds are {_valid_kinds()}"
        ) from err
    except ValueError:  # signature not introspectable (C extension): trust it
        return
