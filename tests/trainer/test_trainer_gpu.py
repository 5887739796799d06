"""The trainer's CUDA paths (opt-in: ``make test-gpu``): FusedAdam as a CUDA op, phases timed with the device synchronised."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from g2rpo.training.drivers import build_optimizer
from g2rpo.training.run_config import load_run_config
from g2rpo.training.trainer import _timed
from tests.trainer.trainer_testlib import as_cli, tiny_overrides

pytestmark = pytest.mark.gpu


def _config(**train):
    overrides = tiny_overrides(Path("model"), Path("run"))
    overrides["train"].update(train)
    return load_run_config(None, as_cli(overrides))


def test_fused_adam_builds_and_steps_like_torch_adamw():
    config = _config(learning_rate=1e-2, weight_decay=0.0)
    start = torch.randn(64, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    params = [torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())]
    fused = build_optimizer(config, [params[0]], torch.device("cuda"))
    config.deepspeed.optimizer = "adamw"
    plain = build_optimizer(config, [params[1]], torch.device("cuda"))
    assert type(fused).__name__ == "FusedAdam"
    for _ in range(3):
        for p, opt in zip(params, (fused, plain)):
            opt.zero_grad()
            (p**2).sum().backward()
            opt.step()
    torch.testing.assert_close(params[0], params[1], rtol=1e-5, atol=1e-6)


def test_a_phase_is_charged_for_its_own_kernels():
    a = torch.randn(4096, 4096, device="cuda")

    def work():
        for _ in range(20):
            a @ a  # queued: returns before the device has finished

    work()  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    work()
    torch.cuda.synchronize()
    on_device = time.perf_counter() - start
    seconds = {"work": 0.0}
    with _timed(seconds, "work", torch.device("cuda")):
        work()
    # without the synchronisation the phase would be charged only the launches (far less than the kernels)
    assert seconds["work"] > 0.5 * on_device


def test_flux_dev_blocks_back_propagate_at_720_with_the_trainers_attention_setting():
    """The first H200 run's failure (CUBLAS_STATUS_EXECUTION_FAILED in the backward with cuDNN's attention),
    on one double and one single block of FLUX.1-dev's widths at 720², gradient checkpointing on."""
    from diffusers import FluxTransformer2DModel

    from benchmarks.gpu_flux_step import FLUX_DEV
    from g2rpo.models.flux import FluxConditioning, FluxVelocity, avoid_cudnn_attention, packed_shape

    avoid_cudnn_attention(torch.device("cuda"))
    torch.manual_seed(0)
    transformer = FluxTransformer2DModel(**dict(FLUX_DEV, num_layers=1, num_single_layers=1)).to("cuda", torch.bfloat16)
    velocity = FluxVelocity(transformer, height=720, width=720, guidance=3.5, gradient_checkpointing=True)
    length, channels = packed_shape(720, 720)
    cond = FluxConditioning(
        torch.randn(1, 512, 4096, device="cuda", dtype=torch.bfloat16),
        torch.randn(1, 768, device="cuda", dtype=torch.bfloat16),
    )
    x = torch.randn(1, length, channels, device="cuda")
    velocity(x, torch.full((1,), 0.9, device="cuda"), cond).square().mean().backward()
    torch.cuda.synchronize()
    grads = [p.grad for p in transformer.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
