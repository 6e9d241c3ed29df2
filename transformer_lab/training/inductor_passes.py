"""Inductor graph passes of ``train.compile`` (``compile._inductor_backend``). A module of its
own because it imports ``torch._inductor`` (0.7 s), which only a run that compiles should pay.
"""

from __future__ import annotations

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files


class UnfusedBias(CustomGraphPass):
    """Inductor post-grad pass (CPU): ``addmm(bias, a, b)`` -> ``mm(a, b) + bias`` (and
    ``baddbmm`` -> ``bmm + bias``, the seed-stacked linears'). ATen's CPU addmm first copies
    the broadcast bias into its fresh output (a whole extra pass over it); unfused, the bias add
    joins the pointwise kernel that follows (GELU, the residual add, the head split). Inductor
    does the same on GPUs only (``unfuse_bias_add_to_pointwise``)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        aten = torch.ops.aten
        for fused, product_op in ((aten.addmm.default, aten.mm.default),
                                  (aten.baddbmm.default, aten.bmm.default)):
            for node in list(graph.find_nodes(op="call_function", target=fused)):
                if node.kwargs or len(node.args) != 3:  # beta / alpha given: leave it
                    continue
                bias, mat1, mat2 = node.args
                with graph.inserting_before(node):
                    product = graph.call_function(product_op, (mat1, mat2))
                    total = graph.call_function(aten.add.Tensor, (product, bias))
                product.meta, total.meta = dict(node.meta), dict(node.meta)  # same shape, dtype
                node.replace_all_uses_with(total)
                graph.erase_node(node)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
