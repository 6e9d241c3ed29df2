"""Generation speed: ``model.generate`` with its KV cache against the full re-forward it replaced.

The ``small`` model (d_model 64, 4 heads, 2 layers, the reverse-task model) as a decoder with
each PE kind's built-in (rope, alibi, sinusoidal), on the CPU with one thread, generates
``--new`` tokens (default 256) greedily after an 8-token prefix, for a batch of 1 and of 16:

* cached: ``model.generate`` (one forward over the prefix, then one token per forward);
* uncached: the loop ``generate`` was before the cache, every step a forward over the whole
  sequence so far (kept here only, as the baseline).

Both must give the same tokens (checked). Runs alternate (ABAB...) so that load from other
processes hits both alike; the median of ``--repeats`` runs is reported as new tokens per second
(batch x new tokens / seconds) and the ratio cached / uncached. Writes ``benchmarks/generate.csv``.

    .venv/bin/python -m benchmarks.generate [--repeats 3] [--new 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import write_csv
from transformer_lab.config.compose import compose
from transformer_lab.model import TransformerModel, build_model

PREFIX = 8
VOCAB = 64
COLUMNS = ["pe", "batch", "prefix", "new_tokens", "cached_tokens_per_s",
           "uncached_tokens_per_s", "speedup", "threads", "torch"]


@torch.no_grad()
def generate_without_cache(model: TransformerModel, prefix: torch.Tensor,
                           n_new: int) -> torch.Tensor:
    """Greedy decoding by a full forward over the whole sequence for every new token (the
    baseline): (B, P) -> (B, n_new)."""
    tokens = prefix
    for _ in range(n_new):
        next_token = model(tokens)[:, -1].argmax(dim=-1, keepdim=True)  # (B, 1)
        tokens = torch.cat([tokens, next_token], dim=1)  # (B, T + 1)
    return tokens[:, prefix.shape[1]:]


def small_decoder(pe: str) -> TransformerModel:
    cfg = compose(["experiment=reverse_task", "model=small", "arch=decoder", f"pe={pe}"])
    cfg.model.vocab_size = VOCAB
    return build_model(cfg, seed=0).eval()


def timed(fn, *args) -> tuple[float, torch.Tensor]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def measure(pe: str, batch: int, n_new: int, repeats: int) -> dict:
    model = small_decoder(pe)
    prefix = torch.randint(1, VOCAB, (batch, PREFIX), generator=torch.Generator().manual_seed(0))
    model.generate(prefix, 4)  # warm-up (tables, allocator)
    cached, uncached = [], []
    for _ in range(repeats):
        seconds, with_cache = timed(model.generate, prefix, n_new)
        cached.append(seconds)
        seconds, without = timed(generate_without_cache, model, prefix, n_new)
        uncached.append(seconds)
        if not torch.equal(with_cache, without):  # ties at float32 rounding aside: report it
            same = (with_cache == without).float().mean().item()
            print(f"  note: pe={pe} batch={batch}: {same:.1%} of the tokens agree")
    tokens = batch * n_new
    cached_rate = tokens / statistics.median(cached)
    uncached_rate = tokens / statistics.median(uncached)
    return {"pe": pe, "batch": batch, "prefix": PREFIX, "new_tokens": n_new,
            "cached_tokens_per_s": round(cached_rate),
            "uncached_tokens_per_s": round(uncached_rate),
            "speedup": round(cached_rate / uncached_rate, 2), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new", type=int, default=256, help="tokens to generate")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("generate.csv"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for pe in ("rope", "alibi", "sinusoidal"):
        for batch in (1, 16):
            row = measure(pe, batch, args.new, args.repeats)
            print(f"pe={pe:10s} batch={batch:2d}: {row['cached_tokens_per_s']:>7} tokens/s cached, "
                  f"{row['uncached_tokens_per_s']:>7} uncached: {row['speedup']}x")
            rows.append(row)
    write_csv(args.out, rows, COLUMNS)


if __name__ == "__main__":
    main()
