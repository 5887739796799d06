"""The trainer keeps PyTorch off cuDNN's attention kernel on CUDA (its backward fails at FLUX.1-dev's
shapes on an H200: benchmarks/results/gpu-h200/), and leaves the CPU as it is."""

from __future__ import annotations

import pytest
import torch

from g2rpo.models.flux import avoid_cudnn_attention


@pytest.fixture
def cudnn_sdp_flag():
    before = torch.backends.cuda.cudnn_sdp_enabled()
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_on_cuda_cudnn_attention_is_turned_off_and_the_others_stay(cudnn_sdp_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    flash, efficient = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.mem_efficient_sdp_enabled()
    assert avoid_cudnn_attention(torch.device("cuda", 0)) is True
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() == flash
    assert torch.backends.cuda.mem_efficient_sdp_enabled() == efficient
    assert avoid_cudnn_attention(torch.device("cuda", 0)) is False  # already off: nothing to do


def test_on_the_cpu_nothing_changes(cudnn_sdp_flag):
    torch.backends.cuda.enable_cudnn_sdp(True)
    assert avoid_cudnn_attention(torch.device("cpu")) is False
    assert torch.backends.cuda.cudnn_sdp_enabled()
