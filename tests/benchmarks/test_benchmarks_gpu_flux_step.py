"""The GPU benchmark's whole code path, run on the CPU at a tiny size (``--device cpu --tiny``).

Meta-device build, bf16 materialisation, the sampling phase through the project's ODE sampler,
one G²RPO term forward+backward with the FLOP counts, the JSON: this checks the code and the
invariants of its counts, not the speed (the numbers of such a run mean nothing).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_flux_step

REPO = Path(__file__).resolve().parents[2]


def run_tiny(out: Path, *extra: str) -> dict:
    result = gpu_flux_step.main(["--device", "cpu", "--tiny", "--output", str(out), *extra])
    assert json.loads(out.read_text(encoding="utf-8")) == result
    return result


def test_help_names_what_it_measures():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_flux_step", "--help"], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0 and "MFU" in done.stdout and "--tiny" in done.stdout


def test_tiny_cpu_mode_runs_every_phase_and_counts_consistently(tmp_path, capsys):
    result = run_tiny(tmp_path / "ckpt.json")
    assert "images/s" in capsys.readouterr().out
    assert result["tiny"] and result["image_tokens"] == 16 and result["group_size"] == 12  # (64 / 16)² tokens
    assert result["config"]["num_layers"] == 1 and result["config"]["num_single_layers"] == 1
    assert result["flop_counting"] == "torch.utils.flop_counter.FlopCounterMode"
    sampling = result["sampling"]
    assert sampling["group_size"] == 12 and sampling["steps"] == 2 and sampling["images_per_s"] > 0
    assert sampling["forwards_per_s"] == pytest.approx(sampling["images_per_s"] * sampling["steps"])
    assert sampling["estimated_paper_rollout_seconds_per_prompt"] == pytest.approx(1892 / sampling["forwards_per_s"])
    assert sampling["batch_1_images_per_s"] > 0 and len(sampling["batch_1_seconds"]) == len(sampling["seconds"]) == 1
    ratio = sampling["per_forward_ratio_batch_1_vs_batched"]
    assert sampling["predicted_ratio_vs_reference_loop"] == pytest.approx(2188 / 1892 * ratio)
    training = result["training"]
    # checkpointing recomputes the blocks' forward: executed = model FLOPs + that recompute
    assert result["gradient_checkpointing"]
    assert 0 < training["recomputed_flops"] < training["forward_flops"]
    assert training["executed_flops_per_step"] == training["model_flops_per_step"] + training["recomputed_flops"]
    # full fine-tune: backward ≈ 2 forwards (input and weight gradients)
    assert 2.5 < training["model_flops_per_step"] / training["forward_flops"] < 3.5
    assert result["flops_per_step"] == training["model_flops_per_step"]
    assert result["trainable_parameters"] == result["parameters"] > 0
    assert result["achieved_tflops"] > 0 and result["mfu_vs_measured_ceiling"] > 0
    assert result["mfu_vs_datasheet"] is None  # no datasheet peak for a CPU

    plain = run_tiny(tmp_path / "plain.json", "--no-checkpointing", "--group-size", "2")
    # the same step without checkpointing: same model FLOPs, nothing recomputed
    assert plain["training"]["recomputed_flops"] == 0
    assert plain["training"]["model_flops_per_step"] == training["model_flops_per_step"]


def test_datasheet_peaks():
    assert gpu_flux_step.datasheet_bf16_dense_tflops("NVIDIA H200") == 989.5  # 1,979 with sparsity, halved
    assert gpu_flux_step.datasheet_bf16_dense_tflops("NVIDIA H200 NVL") == 835.5
    assert gpu_flux_step.datasheet_bf16_dense_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert gpu_flux_step.datasheet_bf16_dense_tflops("NVIDIA H100 PCIe") is None
    assert gpu_flux_step.datasheet_bf16_dense_tflops("cpu (code-path check only)") is None
