"""The GPU path (``train.device=cuda``, bf16 autocast, SDPA's fused kernels). Skipped where
torch sees no CUDA device; CI has none, so these run on a lent GPU
machine (``benchmarks/gpu_check.sh``)."""

from __future__ import annotations

import pytest
import torch

from transformer_lab.config.compose import compose
from transformer_lab.config.instantiate import build_task
from transformer_lab.config.spec import RunSpec
from transformer_lab.model import build_model
from transformer_lab.training.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

REVERSE = ["experiment=reverse_task", "model=small", "task.seq_len=8", "train.batch_size=64",
           "train.lr=3e-3", "train.log_every=1", "train.eval_every=0"]


def trainer_on(device: str, *overrides: str, seed: int = 0) -> Trainer:
    spec = RunSpec.of(compose([*REVERSE, f"train.device={device}", *overrides]))
    task = build_task(spec)
    return Trainer(build_model(spec.with_vocab(task.vocab_size).model, seed=seed), task,
                   spec.train, seed)


@pytest.mark.parametrize("pe", ["rope", "alibi", "t5"])
def test_cuda_fp32_follows_the_cpu_run(pe):
    """Same seed, same batches: the GPU's fp32 losses follow the CPU's (kernels differ, so
    only up to rounding; TF32 is off by default in torch)."""
    cpu = trainer_on("cpu", f"pe={pe}").fit(8).train_losses
    gpu = trainer_on("cuda", f"pe={pe}").fit(8).train_losses
    assert gpu == pytest.approx(cpu, rel=2e-3, abs=2e-3)


def test_bf16_autocast_on_cuda_trains_with_fused_attention_only():
    """With the math fallback of SDPA switched off, a bf16 step must run on a fused kernel
    (flash or memory-efficient); the loss falls and the master weights stay fp32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    trainer = trainer_on("cuda", "train.precision=bf16", "pe=rope", "train.lr=1e-2")
    dtypes = []
    hook = trainer.model.blocks[0].attention.qkv_proj.register_forward_hook(
        lambda module, args, out: dtypes.append(out.dtype))
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        result = trainer.fit(60)
    hook.remove()
    assert set(dtypes) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 and p.is_cuda for p in trainer.model.parameters())
    assert result.train_losses[-1] < 0.8 * result.train_losses[0]


def test_cli_smoke_on_cuda(tlab, tmp_path):
    code, out, err = tlab("experiment=smoke", "train.device=cuda", "train.precision=bf16",
                          f"hydra.run.dir={tmp_path}/run")
    assert code == 0, err
    assert (tmp_path / "run" / "smoke.csv").exists()
