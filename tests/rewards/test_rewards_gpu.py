"""Reward heads on a CUDA device (opt-in: `make test-gpu`): same scores as on the CPU."""

from __future__ import annotations

import pytest
import torch

from g2rpo.rewards.config import RewardModelConfig
from g2rpo.rewards.registry import build_reward

pytestmark = pytest.mark.gpu


def test_every_tiny_head_scores_on_cuda_like_on_cpu(
    tiny_hps, tiny_clip_dir, tiny_pickscore, tiny_image_reward, tiny_answering_judge
):
    entries = [
        RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent)),
        RewardModelConfig(name="clip", weights=str(tiny_clip_dir["dir"])),
        RewardModelConfig(name="pickscore", weights=str(tiny_pickscore["dir"])),
        RewardModelConfig(name="image_reward", weights=str(tiny_image_reward["checkpoint"])),
        RewardModelConfig(name="unified_reward_score", weights=str(tiny_answering_judge), max_new_tokens=12),
        RewardModelConfig(name="sharpness"),
    ]
    images = torch.rand(4, 3, 48, 40, generator=torch.Generator().manual_seed(0))
    prompts = ["a cat", "a dog", "a red car", "a tree at night"]
    for entry in entries:
        cpu = build_reward(entry, device="cpu").score(images, prompts)
        gpu_head = build_reward(entry, device="cuda")
        on_gpu = gpu_head.score(images.cuda(), prompts)
        assert on_gpu.device.type == "cuda"
        # cuDNN may use TF32 convolutions: a looser bound than float32 on the CPU
        torch.testing.assert_close(on_gpu.cpu(), cpu, rtol=0, atol=5e-3)
        # CPU images are moved to the head's device; the scores come back on the images' device
        assert build_reward(entry, device="cuda").score(images, prompts).device.type == "cpu"
        bf16 = build_reward(entry, device="cuda", dtype="bfloat16").score(images.cuda(), prompts)
        assert bool(torch.isfinite(bf16).all())
