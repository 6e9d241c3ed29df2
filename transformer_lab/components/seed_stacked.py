"""Seed-stacked forms of tlab's own layers: S independent copies of a layer as one layer.

A model of S seeds is the single model with its leaf layers swapped for seed-stacked ones
(``training/seed_stack.py``). Each of tlab's layers that holds parameters declares its stacked
form itself (``seed_stacked``, the name of one of the classes here); torch's own
leaves (``nn.Linear``, ``nn.Embedding``) are mapped in ``training/seed_stack_layers.py``.

Every other module is unchanged and sees a batch of S*B sequences laid out seed-major: rows
``s*B .. (s+1)*B - 1`` belong to seed s. Each layer keeps the parameter names of the layer it
replaces, with a leading seed axis; ``seed_slice(name, s)`` is seed s's tensor in the single
layer's shape and ``unstack(s)`` gives back the single layer. Nothing mixes seeds: seed s's
outputs and gradients are those of the single layer s on its own rows
(``tests/test_seed_stack.py``).

Per-seed vectors (biases, norm gains) are stored as (S, 1, D), so they broadcast against the
activations viewed as (S, B*T, D) without an unsqueeze node per call (tiny models are
overhead-bound: every autograd node counts).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from transformer_lab.components.norms import RMSNorm, SequenceBatchNorm
from transformer_lab.components.positional import LearnedPositionalEncoding, T5RelativeBias


class SeedStackedLayer(nn.Module):
    """Base of the stacked layers: records each stacked tensor's single-layer shape."""

    def __init__(self) -> None:
        nn.Module.__init__(self)  # not super(): the PE subclasses skip their single __init__
        self.single_shapes: dict[str, torch.Size] = {}

    def stack(self, name: str, tensors: list[torch.Tensor | None], broadcast: bool = False,
              buffer: bool = False) -> None:
        """Register ``name`` as the seeds' ``tensors`` stacked on a new leading axis: (S, *shape),
        or (S, 1, *shape) with ``broadcast``; a parameter unless ``buffer``. None stays None."""
        if tensors[0] is None:
            setattr(self, name, None)
            return
        stacked = torch.stack([t.detach() for t in tensors])  # (S, *shape)
        if broadcast:
            stacked = stacked.unsqueeze(1)  # (S, 1, *shape)
        if buffer:
            self.register_buffer(name, stacked)
        else:
            setattr(self, name, nn.Parameter(stacked))
        self.single_shapes[name] = tensors[0].shape

    def slice_of(self, tensor: torch.Tensor, name: str, s: int) -> torch.Tensor:
        """Seed s's part of ``tensor`` (laid out as the stacked ``name``: the tensor itself or
        its gradient) in the single layer's shape, a view."""
        return tensor[s].view(self.single_shapes[name])

    def seed_slice(self, name: str, s: int) -> torch.Tensor:
        """Seed s's ``name`` in the single layer's shape (a view)."""
        return self.slice_of(getattr(self, name), name, s)

    def seed_grad(self, name: str, s: int) -> torch.Tensor | None:
        """Seed s's gradient of ``name`` in the single layer's shape (a view), or None."""
        grad = getattr(self, name).grad
        return None if grad is None else self.slice_of(grad, name, s)

    def seed_parameter(self, name: str, s: int) -> nn.Parameter | None:
        if getattr(self, name) is None:
            return None
        return nn.Parameter(self.seed_slice(name, s).detach().clone(
            memory_format=torch.contiguous_format))


# Elements per seed from which S calls of a fused per-seed kernel (e.g. ``F.layer_norm`` with
# its affine) beat one call without the affine plus the per-seed affine as separate ops (which
# read and write the activations again, forward and backward). Measured on the 2-core CPU, one
# thread, 8 seeds: tokens x d of 4,096 per seed: 0.16 ms one call vs 0.34 ms per seed; 16,384:
# 0.64 vs 0.73 ms; 65,536 (the ``small`` benchmark): 2.0 vs 1.5 ms (forward + backward).
PER_SEED_KERNELS_MIN = 32768


class SeedStackedLayerNorm(SeedStackedLayer):
    """LayerNorm (Ba et al. 2016) with a gain g_s and bias b_s per seed:
    y = (x - mean(x)) / sqrt(var(x) + eps) * g_s + b_s, statistics over each token's features
    (per row, so the seeds never mix); (S*B, T, D) -> (S*B, T, D). Small activations: one
    ``F.layer_norm`` without the affine, then the per-seed gain and bias broadcast over
    (S, B*T, D); large ones (``PER_SEED_KERNELS_MIN``): one fused call per seed."""

    def __init__(self, layers: list[nn.LayerNorm]) -> None:
        super().__init__()
        self.single_class = type(layers[0])  # nn.LayerNorm or components.norms.LayerNorm
        self.normalized_shape, self.eps = layers[0].normalized_shape, layers[0].eps
        self.stack("weight", [layer.weight for layer in layers], broadcast=True)  # (S, 1, D)
        self.stack("bias", [layer.bias for layer in layers], broadcast=True)  # (S, 1, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds, _, dim = self.weight.shape
        if x.numel() // seeds >= PER_SEED_KERNELS_MIN:
            return self._per_seed(x, seeds, dim)
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps).view(seeds, -1, dim)
        y = y * self.weight if self.bias is None else y * self.weight + self.bias
        return y.view(x.shape)  # (S*B, T, D)

    def _per_seed(self, x: torch.Tensor, seeds: int, dim: int) -> torch.Tensor:
        """S calls of the fused ``F.layer_norm`` (affine included), one per seed's rows."""
        weights = self.weight.view(seeds, dim).unbind(0)  # S x (D,)
        biases = [None] * seeds if self.bias is None else self.bias.view(seeds, dim).unbind(0)
        if seeds == 1:  # no split and concatenation
            return F.layer_norm(x, self.normalized_shape, weights[0], biases[0], self.eps)
        parts = x.split(x.shape[0] // seeds)  # S x (B, T, D)
        return torch.cat([F.layer_norm(part, self.normalized_shape, w, b, self.eps)
                          for part, w, b in zip(parts, weights, biases, strict=True)])

    def unstack(self, s: int) -> nn.LayerNorm:
        layer = self.single_class(self.normalized_shape[0], eps=self.eps)
        layer.weight, layer.bias = self.seed_parameter("weight", s), self.seed_parameter("bias", s)
        return layer


class SeedStackedRMSNorm(SeedStackedLayer):
    """RMSNorm (Zhang & Sennrich 2019) with a gain per seed: y = x / sqrt(mean(x^2) + eps) * g_s,
    the same arithmetic as ``components.norms.RMSNorm``; (S*B, T, D) -> (S*B, T, D)."""

    def __init__(self, layers: list[RMSNorm]) -> None:
        super().__init__()
        self.eps = layers[0].eps
        self.stack("weight", [layer.weight for layer in layers], broadcast=True)  # (S, 1, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds, _, dim = self.weight.shape
        rms = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (S*B, T, 1)
        y = (x.float() * rms).type_as(x).view(seeds, -1, dim)  # (S, B*T, D)
        return (y * self.weight).view(x.shape)

    def unstack(self, s: int) -> RMSNorm:
        layer = RMSNorm(self.weight.shape[-1], eps=self.eps)
        layer.weight = self.seed_parameter("weight", s)
        return layer


class SeedStackedBatchNorm(SeedStackedLayer):
    """BatchNorm over each seed's own B*T rows (Ioffe & Szegedy 2015), per-seed running stats.

    The S seeds' D features become S*D channels of one ``F.batch_norm``:
    x (S*B, T, D) -> (S, B*T, D) -> (B*T, S*D) -> normalise per channel -> back. So channel
    (s, d) sees only seed s's rows, and ``running_mean``/``running_var`` (S, D) are updated as
    S single layers update theirs (``num_batches_tracked`` too, one count per seed).
    """

    def __init__(self, layers: list[SequenceBatchNorm]) -> None:
        super().__init__()
        first = layers[0]
        if not (first.affine and first.track_running_stats):
            raise ValueError("seed stacking needs BatchNorm with affine=True and running stats")
        self.eps, self.momentum = first.eps, first.momentum
        self.stack("weight", [layer.weight for layer in layers])  # (S, D)
        self.stack("bias", [layer.bias for layer in layers])  # (S, D)
        self.stack("running_mean", [m.running_mean for m in layers], buffer=True)  # (S, D)
        self.stack("running_var", [m.running_var for m in layers], buffer=True)  # (S, D)
        self.stack("num_batches_tracked", [m.num_batches_tracked for m in layers],
                   buffer=True)  # (S,): equal while the seeds step together

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seeds, dim = self.weight.shape
        factor = 0.0
        if self.training:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked[0]) if self.momentum is None
                      else self.momentum)
        rows = x.reshape(seeds, -1, dim).transpose(0, 1).reshape(-1, seeds * dim)  # (B*T, S*D)
        y = F.batch_norm(rows, self.running_mean.view(-1), self.running_var.view(-1),
                         self.weight.view(-1), self.bias.view(-1), self.training, factor,
                         self.eps)  # (B*T, S*D)
        return y.view(-1, seeds, dim).transpose(0, 1).reshape(x.shape)  # (S*B, T, D)

    def unstack(self, s: int) -> SequenceBatchNorm:
        layer = SequenceBatchNorm(self.weight.shape[1], eps=self.eps, momentum=self.momentum)
        layer.weight, layer.bias = self.seed_parameter("weight", s), self.seed_parameter("bias", s)
        with torch.no_grad():
            layer.running_mean.copy_(self.running_mean[s])
            layer.running_var.copy_(self.running_var[s])
            layer.num_batches_tracked.copy_(self.num_batches_tracked[s])
        return layer


class SeedStackedLearnedPE(SeedStackedLayer, LearnedPositionalEncoding):
    """A learned position table per seed (BERT-style, or ``sinusoidal_learned``).

    positions (T,) -> (S, T, d_model): the model adds row s to seed s's sequences
    (``seed_stack.add_positional``). Interpolation, when enabled, resamples each seed's table.
    """

    def __init__(self, layers: list[LearnedPositionalEncoding]) -> None:
        first = layers[0]
        SeedStackedLayer.__init__(self)
        self.d_model, self.max_len = first.d_model, first.max_len
        self.init, self.interpolate = first.init, first.interpolate
        self.stack("weight", [layer.weight for layer in layers])  # (S, max_len, d_model)

    def table(self, length: int) -> torch.Tensor:
        if length <= self.max_len:
            return self.weight[:, :length]  # (S, length, d)
        if not self.interpolate:
            raise ValueError(
                f"sequence length {length} is longer than the learned position table "
                f"(max_len={self.max_len}); use sequences of at most {self.max_len} tokens, "
                f"a larger max_len, or interpolate=True"
            )
        table = self.weight.transpose(1, 2)  # (S, d, max_len)
        table = F.interpolate(table, size=length, mode="linear", align_corners=True)
        return table.transpose(1, 2)  # (S, length, d)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        if positions.numel() == 0:
            return self.weight[:, :0]  # (S, 0, d)
        if torch.compiler.is_compiling() and positions.shape[0] <= self.max_len:
            # ``_checked`` reads values (a graph break); a traced forward's positions are the
            # model's arange(T), in the stored tables (as ``LearnedPositionalEncoding.forward``)
            return self.weight.index_select(1, positions)  # (S, T, d_model)
        length, in_order = self._checked(positions)
        if in_order:  # 0, 1, ..., T-1 (the model's cached positions): a slice, not a gather
            return self.table(length)  # (S, T, d_model)
        return self.table(length).index_select(1, positions)  # (S, T, d_model)

    def _checked(self, positions: torch.Tensor) -> tuple[int, bool]:
        """(max + 1, whether positions are 0..T-1) of ``positions``; ValueError if one is < 0.
        Remembered for the last tensor seen (the model passes the same cached ``arange`` every
        step), so a step pays no host syncs for it."""
        last = self.__dict__.get("_last_positions")
        if last is not None and last[0] is positions:
            return last[1], last[2]
        if int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
        length = int(positions.max()) + 1
        in_order = positions.dim() == 1 and len(positions) == length and bool(
            (positions == torch.arange(length, device=positions.device)).all())
        if not torch.is_inference_mode_enabled():
            self.__dict__["_last_positions"] = (positions, length, in_order)
        return length, in_order

    def unstack(self, s: int) -> LearnedPositionalEncoding:
        layer = LearnedPositionalEncoding(self.d_model, self.max_len, self.init, self.interpolate)
        layer.weight = self.seed_parameter("weight", s)
        return layer


class SeedStackedTable(SeedStackedLayer):
    """A stacked (S, rows, cols) table under the name ``weight`` (T5's bias embedding)."""

    def __init__(self, layers: list[nn.Embedding]) -> None:
        super().__init__()
        self.stack("weight", [layer.weight for layer in layers])  # (S, rows, cols)


class SeedStackedT5Bias(SeedStackedLayer, T5RelativeBias):
    """T5's bucketed relative bias (Raffel et al. 2019) with a table E_s per seed:
    bias[s, h, i, j] = E_s[bucket(j - i), h]; (q_len, k_len) -> (S, H, q_len, k_len)."""

    def __init__(self, layers: list[T5RelativeBias]) -> None:
        first = layers[0]
        SeedStackedLayer.__init__(self)
        self.n_heads, self.num_buckets = first.n_heads, first.num_buckets
        self.max_distance, self.bidirectional = first.max_distance, first.bidirectional
        self.relative_attention_bias = SeedStackedTable(
            [layer.relative_attention_bias for layer in layers])  # weight (S, buckets, H)
        self.register_buffer("buckets", first.buckets.clone(), persistent=False)

    def forward(self, q_len: int, k_len: int) -> torch.Tensor:
        buckets = self._bucket_matrix(q_len, k_len)  # (Tq, Tk)
        values = self.relative_attention_bias.weight[:, buckets]  # (S, Tq, Tk, H)
        return values.permute(0, 3, 1, 2)  # (S, H, Tq, Tk)

    def unstack(self, s: int) -> T5RelativeBias:
        layer = T5RelativeBias(self.n_heads, self.num_buckets, self.max_distance,
                               self.bidirectional)
        layer.relative_attention_bias.weight = self.relative_attention_bias.seed_parameter(
            "weight", s)
        return layer
