"""The GPU run's script and its parts, rehearsed on the CPU (``--cpu-rehearsal``, ``--device cpu --tiny``).

What a GPU run can only find out there (speed, CUDA ops, memory) is not checked here; what is: every
step runs and writes its JSON, the model folder of FLUX.1-dev's layout loads through the trainer, the
trainer's phase seconds and the paper-iteration extrapolation are consistent, and the wheel-set check
names a missing requirement.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_rewards

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def rehearse(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """benchmarks/gpu_run.sh --cpu-rehearsal into tmp_path/out with this interpreter."""
    return subprocess.run(
        ["bash", "benchmarks/gpu_run.sh", str(tmp_path / "out"), "--cpu-rehearsal"],
        cwd=REPO,
        env={**os.environ, "G2RPO_PYTHON": sys.executable, "TMPDIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_gpu_run_rehearses_every_step_on_the_cpu(tmp_path):
    done = rehearse(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = tmp_path / "out"
    for name in ("gpu_flux_step.json", "gpu_train_iteration.json", "gpu_rewards.json", "profile.txt", "gpu_run.log"):
        assert (out / name).is_file(), name
    log = (out / "gpu_run.log").read_text()
    assert "=== gpu_run: 0 step(s) failed" in log
    for step in ("flux_step", "train_iteration", "rewards"):
        assert f"=== {step}: exit 0 after" in log
    flux = json.loads((out / "gpu_flux_step.json").read_text())
    profile = flux["training"]["profile"]
    assert "error" not in profile and profile["total_us"] > 0
    assert sum(profile["shares"].values()) == pytest.approx(1.0)


def test_a_failing_step_is_counted_and_the_next_still_runs(tmp_path):
    # a time limit of 1 s stops the first measurement; the others run, and the exit status counts the failure
    # (the attention check is skipped: G2RPO_BENCH_SDPA given; and so are the reward heads)
    done = rehearse(tmp_path, G2RPO_GPU_LIMITS="0 1 300 300", G2RPO_BENCH_SDPA="default", G2RPO_GPU_SKIP_REWARDS="1")
    assert done.returncode == 1, done.stdout[-3000:]
    log = (tmp_path / "out" / "gpu_run.log").read_text()
    assert "=== flux_step: exit 124" in log and "(time limit)" in log
    assert "=== train_iteration: exit 0" in log and "1 step(s) failed" in log
    assert "gpu_diag" not in log and "=== rewards" not in log


def test_the_train_iteration_trains_on_a_model_folder_of_flux_dev_layout(tmp_path):
    # in its own process, as gpu_run.sh runs it: DeepSpeed's one-process group sets MASTER_PORT in the environment
    command = [
        sys.executable,
        "-m",
        "benchmarks.gpu_train_iteration",
        "--device",
        "cpu",
        "--tiny",
        "--small-transformer",
    ]
    command += ["--workdir", str(tmp_path), "--output", str(tmp_path / "r.json")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["setup_seconds"] > 0
    # the folder the full run writes: FLUX.1-dev's VAE, text encoders of FLUX.1-dev's widths
    assert result["model_folder"]["vae_parameters"] > 80e6
    vae = json.loads((tmp_path / "model" / "vae" / "config.json").read_text())
    assert vae["block_out_channels"] == [128, 256, 512, 512] and vae["latent_channels"] == 16
    t5 = json.loads((tmp_path / "model" / "text_encoder_2" / "config.json").read_text())
    assert t5["d_model"] == 4096
    assert result["optimizer"] == "AdamW"  # auto on the CPU
    assert len(result["iterations"]) == 2 == len(result["iteration_wall_seconds"])
    last = result["iterations"][-1]
    assert set(last["seconds"]) == {"sampling", "decoding", "reward", "training"}
    assert 0 < last["optimizer_seconds"] <= last["seconds"]["training"]
    assert last["optimizer_steps"] == 1
    # the phases are timed inside the iteration's wall time
    assert sum(last["seconds"].values()) <= result["iteration_wall_seconds"][-1]
    paper = result["paper_iteration_phase_seconds_extrapolated"]
    per_forward = last["seconds"]["sampling"] / last["sampling_forwards"]
    assert paper["sampling"] == pytest.approx(per_forward * 1892)
    assert paper["decoding"] == pytest.approx(last["seconds"]["decoding"] / last["decoded_images"] * 288)
    assert result["paper_iteration_seconds_extrapolated"] == pytest.approx(sum(paper.values()))


def test_the_reward_benchmark_scores_with_each_head(tmp_path):
    result = gpu_rewards.main(
        ["--device", "cpu", "--tiny", "--n", "4", "--repeats", "1", "--output", str(tmp_path / "r.json")]
    )
    assert set(result["heads"]) == {"hps_v21", "clip", "pickscore"}
    for name, head in result["heads"].items():
        assert head["scores_finite"] and head["images_per_s"] > 0, name
        assert len(head["seconds"]) == 1
    with pytest.raises(SystemExit, match="unknown head 'hps'"):
        gpu_rewards.main(["--device", "cpu", "--tiny", "--heads", "hps", "--output", str(tmp_path / "x.json")])


def _wheel(folder: Path, name: str, requires: list[str]) -> None:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}-1.0.dist-info/METADATA", meta)


def test_the_wheel_check_names_a_missing_requirement(tmp_path):
    listed = [
        line.split("==")[0]
        for line in (REPO / "benchmarks" / "gpu" / "wheels.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for name in listed:
        _wheel(tmp_path, name.replace("-", "_"), [])
    _wheel(
        tmp_path,
        "diffusers",
        ["numpy", "no-such-package>=1", 'pywin32; sys_platform == "win32"', "tomli; python_version < '3.11'"],
    )
    check = [sys.executable, str(REPO / "benchmarks" / "gpu" / "check.py"), str(tmp_path)]
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1
    assert "missing: no-such-package (needed by diffusers-1.0-py3-none-any.whl" in done.stdout
    assert "pywin32" not in done.stdout and "tomli" not in done.stdout  # markers evaluated for Linux, Python 3.12
    (tmp_path / "diffusers-1.0-py3-none-any.whl").unlink()
    _wheel(tmp_path, "diffusers", ["numpy"])
    (tmp_path / "timm-1.0-py3-none-any.whl").unlink()
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 1 and "missing: timm: listed in wheels.txt" in done.stdout
