"""The models a user would otherwise pick, each with its own plain training step.

Every builder returns a ``Contender``: a ``step(inputs, targets)`` closure doing one full
optimiser step (forward, cross-entropy over all positions, backward, grad-norm clipping at 1.0,
AdamW with betas (0.9, 0.98)), the model (for parameter counts) and its non-embedding parameter
count N (for the FLOP estimate 6N + 12 L T d per token, Kaplan et al. 2020, arXiv 2001.08361).

* ``tlab``: ``build_model(spec.model)`` and ``Trainer.train_step`` - exactly what ``tlab`` runs.
* ``torch``: ``nn.TransformerEncoder`` (norm_first, GELU, batch_first, dropout 0) behind a token
  embedding (scaled by sqrt(d)) plus a learned position table, a final LayerNorm and a linear
  head; the PyTorch-default ``torch.optim.AdamW`` and ``clip_grad_norm_``.
* ``x-transformers``: ``TransformerWrapper(Encoder(dim, depth, heads, attn_dim_head=d/heads,
  ff_mult=d_ff/d, attn_flash=True))`` - its defaults (pre-norm, GELU FFN, learned absolute PE),
  with flash (SDPA) attention switched on so that it is not handicapped; the same optimiser
  loop as ``torch``. Needs the optional ``bench`` extra (``pip install x-transformers``).

Shapes: inputs and targets are (B, T) token ids; every model maps them to logits (B, T, V).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

LR = 3e-3
BETAS = (0.9, 0.98)
GRAD_CLIP = 1.0

Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class BenchSize:
    """One benchmark configuration (the issue's tiny / small / medium)."""

    name: str
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    seq_len: int
    batch: int
    vocab: int = 10  # the reverse task's default vocabulary


SIZES: dict[str, BenchSize] = {
    "tiny": BenchSize("tiny", d_model=8, n_heads=2, n_layers=1, d_ff=32, seq_len=4, batch=8),
    # small's model on a quarter of its batch: tokens x d_model 16384, stacked in groups of 4
    "mid": BenchSize("mid", d_model=64, n_heads=4, n_layers=2, d_ff=256, seq_len=16, batch=16),
    "small": BenchSize("small", d_model=64, n_heads=4, n_layers=2, d_ff=256, seq_len=16, batch=64),
    "medium": BenchSize("medium", d_model=256, n_heads=8, n_layers=4, d_ff=1024, seq_len=128,
                        batch=16),
    # GPU-sized (benchmarks.run runs them by default on CUDA only): nanoGPT's shakespeare-char
    # network, and GPT-2 small's
    "gpu384": BenchSize("gpu384", d_model=384, n_heads=6, n_layers=6, d_ff=1536, seq_len=256,
                        batch=64),
    "gpt2small": BenchSize("gpt2small", d_model=768, n_heads=12, n_layers=12, d_ff=3072,
                           seq_len=1024, batch=16),
}
GPU_SIZES = ("gpu384", "gpt2small")


@dataclass
class Contender:
    name: str
    model: nn.Module
    step: Step
    non_embedding_params: int


def non_embedding_params(model: nn.Module) -> int:
    """Parameters outside embedding tables (token and position), the N of 6N."""
    excluded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    excluded |= {id(p) for n, p in model.named_parameters()
                 if ("pos" in n and "emb" in n) or n.startswith("positional.")}
    return sum(p.numel() for p in model.parameters() if id(p) not in excluded)


def plain_training_step(model: nn.Module, autocast_dtype: torch.dtype | None,
                        device: torch.device) -> Step:
    """A user's loop: default AdamW, clip_grad_norm_, cross-entropy on every position."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=autocast_dtype or torch.float32,
                            enabled=autocast_dtype is not None):
            logits = model(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        return loss.detach()

    return step


class TorchEncoderLM(nn.Module):
    """Token embedding * sqrt(d) + learned PE -> nn.TransformerEncoder (pre-LN) -> LN -> head."""

    def __init__(self, size: BenchSize) -> None:
        super().__init__()
        d = size.d_model
        self.embed_scale = math.sqrt(d)
        self.token_embedding = nn.Embedding(size.vocab, d)
        self.pos_embedding = nn.Parameter(torch.randn(size.seq_len, d) * 0.02)  # (T, d)
        layer = nn.TransformerEncoderLayer(d, size.n_heads, size.d_ff, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, size.n_layers, norm=nn.LayerNorm(d),
                                             enable_nested_tensor=False)
        self.head = nn.Linear(d, size.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_embedding(tokens) * self.embed_scale + self.pos_embedding[: tokens.shape[1]]
        return self.head(self.encoder(x))  # (B, T, V)


def build_torch(size: BenchSize, device: torch.device, autocast_dtype: torch.dtype | None,
                compile_model: bool) -> Contender:
    model = TorchEncoderLM(size).to(device)
    n = non_embedding_params(model)
    runnable = torch.compile(model) if compile_model else model
    return Contender("torch", model, plain_training_step(runnable, autocast_dtype, device), n)


def build_x_transformers(size: BenchSize, device: torch.device,
                         autocast_dtype: torch.dtype | None, compile_model: bool) -> Contender:
    from x_transformers import Encoder, TransformerWrapper

    model = TransformerWrapper(
        num_tokens=size.vocab,
        max_seq_len=size.seq_len,
        attn_layers=Encoder(dim=size.d_model, depth=size.n_layers, heads=size.n_heads,
                            attn_dim_head=size.d_model // size.n_heads,
                            ff_mult=size.d_ff // size.d_model, attn_flash=True),
    ).to(device)
    n = non_embedding_params(model)
    runnable = torch.compile(model) if compile_model else model
    return Contender("x-transformers", model,
                     plain_training_step(runnable, autocast_dtype, device), n)


def tlab_overrides(size: BenchSize, device: str, precision: str,
                   compile_model: bool = False) -> list[str]:
    """Hydra overrides that make tlab's model the same network as the peers."""
    return [
        "model=small", f"model.d_model={size.d_model}", f"model.n_heads={size.n_heads}",
        f"model.n_layers={size.n_layers}", f"model.d_ff={size.d_ff}",
        f"model.max_len={max(64, size.seq_len)}", "pe=learned", "block=pre",
        "norm_layer=layernorm", "ffn=gelu", "arch=encoder", "task=reverse",
        f"task.seq_len={size.seq_len}", f"task.vocab_size={size.vocab}",
        f"train.batch_size={size.batch}", f"train.lr={LR}", "train.schedule=constant",
        f"train.grad_clip={GRAD_CLIP}", f"train.device={device}", f"train.precision={precision}",
        f"train.compile={str(compile_model).lower()}",
    ]


def build_tlab(size: BenchSize, device: torch.device, precision: str,
               compile_model: bool) -> tuple[Contender, object]:
    """tlab through its public path (``train.compile`` compiles in the trainer); also returns
    the task (for the with-data row)."""
    from transformer_lab.config.compose import compose
    from transformer_lab.config.instantiate import build_task
    from transformer_lab.config.spec import RunSpec
    from transformer_lab.model import build_model
    from transformer_lab.tasks import Batch
    from transformer_lab.training.trainer import Trainer

    spec = RunSpec.of(compose(tlab_overrides(size, str(device), precision, compile_model)))
    task = build_task(spec)
    model = build_model(spec.with_vocab(task.vocab_size).model).to(device)
    n = non_embedding_params(model)
    trainer = Trainer(model, task, spec.train, seed=0)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss, _grad_norm, _lr = trainer.train_step(Batch(inputs, targets))
        return loss

    return Contender("tlab", model, step, n), task
