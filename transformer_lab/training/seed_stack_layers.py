"""Seed-stacked forms of torch's own leaf layers (``nn.Linear``, ``nn.Embedding``,
``nn.LayerNorm``), and ``stacked_form``: how any leaf layer stacks.

tlab's own layers declare their stacked form themselves (``seed_stacked`` on the class, the
stacked classes in ``components/seed_stacked.py``); torch's leaves cannot, so they are mapped
here (``TORCH_LEAVES``). See ``components/seed_stacked.py`` for the layout (seed-major rows,
parameters with a leading seed axis).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components import seed_stacked
from transformer_lab.components.seed_stacked import (
    SeedStackedLayer,
    SeedStackedLayerNorm,
)


class SeedStackedLinear(SeedStackedLayer):
    """S linear maps y_s = x_s W_s^T + b_s as one batched matmul.

    x (S*B, ..., in) -> view (S, N, in) -> ``baddbmm(b, x, W^T)`` (S, N, out) -> (S*B, ..., out).
    ``baddbmm`` was the fastest of baddbmm, bmm + add, matmul, einsum and a loop of ``F.linear``
    on this CPU for the tiny (d 8) and small (d 64) shapes. ``weight`` is stored as the seeds'
    W_s^T, (S, in, out), contiguous as ``bmm`` reads it: no transpose (and no transpose node
    for autograd) per call, and its gradient comes out in that layout; ``seed_slice`` gives
    seed s's (out, in) matrix as a transposed view.
    """

    def __init__(self, layers: list[nn.Linear]) -> None:
        super().__init__()
        self.in_features, self.out_features = layers[0].in_features, layers[0].out_features
        self.stack("weight", [layer.weight.t() for layer in layers])  # (S, in, out): W_s^T
        self.single_shapes["weight"] = layers[0].weight.shape  # (out, in)
        self.stack("bias", [layer.bias for layer in layers], broadcast=True)  # (S, 1, out)

    def slice_of(self, tensor: torch.Tensor, name: str, s: int) -> torch.Tensor:
        if name == "weight":
            return tensor[s].t()  # (out, in), a view of W_s^T
        return super().slice_of(tensor, name, s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(self.weight.shape[0], -1, self.in_features)  # (S, N, in)
        if self.bias is None:
            y = torch.bmm(rows, self.weight)  # (S, N, out)
        else:
            y = torch.baddbmm(self.bias, rows, self.weight)  # (S, N, out)
        return y.view(*x.shape[:-1], self.out_features)  # (S*B, ..., out)

    def unstack(self, s: int) -> nn.Linear:
        layer = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        layer.weight, layer.bias = self.seed_parameter("weight", s), self.seed_parameter("bias", s)
        return layer


class SeedStackedEmbedding(SeedStackedLayer):
    """S lookup tables as one: tokens (S*B, T) -> (S*B, T, D).

    Seed s's token ids are shifted by s*V into the table viewed as (S*V, D), so one
    ``F.embedding`` serves every seed (its backward sums each row's gradients in the order
    the single layer does; ``index_select`` was 15% faster but rounds differently).
    """

    def __init__(self, layers: list[nn.Embedding]) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = layers[0].weight.shape
        self.stack("weight", [layer.weight for layer in layers])  # (S, V, D)
        offsets = torch.arange(len(layers)) * self.num_embeddings
        self.register_buffer("offsets", offsets[:, None], persistent=False)  # (S, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        ids = tokens.reshape(self.weight.shape[0], -1) + self.offsets  # (S, B*T) into (S*V, D)
        table = self.weight.view(-1, self.embedding_dim)  # (S*V, D)
        return F.embedding(ids, table).view(*tokens.shape, self.embedding_dim)  # (S*B, T, D)

    def unstack(self, s: int) -> nn.Embedding:
        layer = nn.Embedding(self.num_embeddings, self.embedding_dim)
        layer.weight = self.seed_parameter("weight", s)
        return layer


# torch's leaf classes (exact types: a subclass may change forward) and their stacked forms.
TORCH_LEAVES: dict[type[nn.Module], type[SeedStackedLayer]] = {
    nn.Linear: SeedStackedLinear,
    nn.Embedding: SeedStackedEmbedding,
    nn.LayerNorm: SeedStackedLayerNorm,
}


def stacked_form(module: nn.Module) -> type[SeedStackedLayer] | None:
    """The class that turns S copies of ``module`` into one stacked layer: the ``seed_stacked``
    its own class declares (a class, or the name of one in ``components/seed_stacked.py``; not
    one inherited: a subclass may change ``forward``), else torch's leaf mapping; None when the
    layer does not stack."""
    declared = vars(type(module)).get("seed_stacked")
    if isinstance(declared, str):
        return getattr(seed_stacked, declared)
    if declared is not None:
        return declared
    return TORCH_LEAVES.get(type(module))
