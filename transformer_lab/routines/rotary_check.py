"""The rotary relative-position check (step 3 of ``tlab validate``, ``tlab reverse-task``,
``tlab mutants``): the scores of a rotary PE must depend on ``n - m`` only."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from transformer_lab.config.instantiate import instantiate_component
from transformer_lab.results.check_rows import CheckRow, Stopwatch, status

# A rotary PE's scores may differ between (m, n) and (m + 1, n + 1) by this fraction of their
# largest magnitude (float32 rounding of the rotation angles).
ROTARY_TOLERANCE = 1e-4


def rotary_relative_check(cfg: DictConfig, n_positions: int = 16) -> CheckRow | None:
    """For a rotary PE: are the scores of one query/key pair a function of ``n - m`` only?

    Rotates the same random ``q`` and ``k`` (1, 1, T, Dh) at every position ``0..T-1`` and
    compares the score matrix ``S[m, n] = q_m . k_n`` with itself shifted by one position:
    ``S[m, n]`` must equal ``S[m + 1, n + 1]``. Returns None for other kinds of PE.
    """
    clock = Stopwatch()
    pe = instantiate_component(cfg, "pe")
    if getattr(pe, "kind", None) != "rotary":
        return None
    head_dim = cfg.model.d_model // cfg.model.n_heads
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(head_dim, generator=generator).expand(1, 1, n_positions, head_dim)
    k = torch.randn(head_dim, generator=generator).expand(1, 1, n_positions, head_dim)
    with torch.no_grad():
        q_rot, k_rot = pe(q.contiguous(), k.contiguous(), torch.arange(n_positions))
    scores = (q_rot @ k_rot.transpose(-2, -1))[0, 0].float()  # (T, T): S[m, n] = q_m . k_n
    drift = (scores[1:, 1:] - scores[:-1, :-1]).abs()  # (T-1, T-1): S[m+1, n+1] vs S[m, n]
    scale = scores.abs().max().clamp_min(1e-12).item()
    worst = drift.max().item()
    ok = worst <= ROTARY_TOLERANCE * scale
    m, n = divmod(int(drift.argmax()), n_positions - 1)
    if ok:
        detail = f"q.k depends on n-m only (largest drift {worst / scale:.1e} of |S|)"
    else:
        detail = (f"q.k at positions (m={m}, n={n}) is {scores[m, n]:.4g} but at "
                  f"({m + 1}, {n + 1}) it is {scores[m + 1, n + 1]:.4g}: a rotary PE must make "
                  "scores depend on n-m only; check that q and k get the same rotation (same "
                  "pairing half/interleaved, same angles per position)")
    return CheckRow(3, "rotary_relative", status(ok), "relative_drift", worst / scale,
                    ROTARY_TOLERANCE, clock.lap(), detail)
