"""Resume at another world size: a DeepSpeed ZeRO-2 run checkpointed by 2 ranks continues on 1
(and 1 → 2) with the same optimiser state — every trainable parameter's fp32 master weights,
``exp_avg`` and ``exp_avg_sq`` right after the resume equal, bit for bit, what DeepSpeed held when
the checkpoint was written — and then trains on (CPU, gloo, torchrun).

Each DeepSpeed start costs ~25 s on two busy cores (imports, engine), so the 2 → 1 proof is two
launches and 1 → 2 is in the slow tier.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_testlib import REPO, run_train, subprocess_env, tiny_overrides

from g2rpo.training.checkpoint import CheckpointManager, TrainerState, verify
from g2rpo.training.run_dir import WRITER
from tests.tiny_flux_fixture import make_tiny_flux

WORKER = Path(__file__).resolve().parent / "trainer_resize_worker.py"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("resize_tiny_flux"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    nproc: int, model: Path, out: Path, iterations: int, dump: Path, stage: int, precision: str
) -> tuple[dict, str]:
    torchrun = Path(sys.executable).parent / "torchrun"
    done = subprocess.run(
        [
            str(torchrun),
            "--nproc_per_node",
            str(nproc),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(WORKER),
            str(model),
            str(out),
            str(stage),
            str(iterations),
            str(dump),
            precision,
        ],
        env=subprocess_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return torch.load(dump, weights_only=False), done.stderr


def _files(folder: Path) -> dict[str, str | None]:
    """Every path under ``folder`` with its content's sha256 (None for a folder)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def _assert_resumed_with_the_same_optimiser_state(
    tiny_model: Path, tmp_path: Path, first: int, second: int, stage: int = 2, precision: str = "fp32"
) -> Path:
    """Train 2 iterations on ``first`` ranks, resume on ``second`` and train 2 more; returns the run's dir."""
    out = tmp_path / "run"
    saved, _ = _launch(first, tiny_model, out, 2, tmp_path / "saved.pt", stage, precision)
    assert saved["world_size"] == first and saved["end"]["iteration"] == 2 and saved["adam_steps"] == [2.0]
    checkpoint = out / "checkpoints" / "iter-000002"
    assert json.loads((checkpoint / "trainer_state.json").read_text())["world_size"] == first

    resumed, stderr = _launch(second, tiny_model, out, 4, tmp_path / "resumed.pt", stage, precision)
    assert resumed["world_size"] == second
    assert f"saved by {first} rank(s), on {second}" in stderr
    # Right after setup: the iteration and, per parameter, exactly the state saved at iteration 2.
    before, after = saved["end"]["state"], resumed["start"]["state"]
    assert resumed["start"]["iteration"] == 2
    assert before.keys() == after.keys() and len(before) > 10
    for name in before:
        for part in ("fp32", "exp_avg", "exp_avg_sq", "module"):
            assert torch.equal(before[name][part], after[name][part]), (name, part)
    assert any(before[n]["exp_avg_sq"].abs().sum() > 0 for n in before)  # real moments, not fresh zeros
    # Training continues: iterations 2 and 3 with one optimiser step each, finite losses, Adam
    # counting on from 2, every tensor finite and most of them moved.
    assert [r["iteration"] for r in resumed["records"]] == [2, 3]
    assert all(r["optimizer_steps"] == 1 and math.isfinite(r["loss"]) for r in resumed["records"])
    assert resumed["adam_steps"] == [4.0] and resumed["end"]["iteration"] == 4
    end = resumed["end"]["state"]
    assert all(torch.isfinite(end[n]["fp32"]).all() for n in end)
    assert sum(not torch.equal(end[n]["fp32"], after[n]["fp32"]) for n in end) > len(end) // 2
    # The new checkpoint is of the new world size; the old one is untouched and no scratch is left.
    assert json.loads((out / "checkpoints" / "iter-000004" / "trainer_state.json").read_text())["world_size"] == second
    verify(checkpoint)
    assert not (out / "checkpoints" / "iter-000002.universal").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["world_size"]) for r in records if "world_size" in r] == [
        (0, first),
        (1, first),
        (2, second),
        (3, second),
    ]
    return out


@pytest.mark.integration
@pytest.mark.timeout(900)
def test_zero2_checkpoint_of_two_ranks_resumes_on_one_with_the_same_optimiser_state(tiny_model, tmp_path):
    _assert_resumed_with_the_same_optimiser_state(tiny_model, tmp_path, first=2, second=1)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_zero2_checkpoint_of_one_rank_resumes_on_two_and_another_zero_stage_is_refused(tiny_model, tmp_path):
    out = _assert_resumed_with_the_same_optimiser_state(tiny_model, tmp_path, first=1, second=2)
    # The workers gave their writer claims back, as a finished run does: no dead process's claim for
    # the next run to take over (and remove) below.
    assert not (out / WRITER).exists()
    # The world size may change, the ZeRO stage may not (each stage has its own file layout):
    # refused up front, naming the field and the stage to resume with, and nothing is written.
    before = _files(out)
    config = tiny_overrides(
        tiny_model,
        out,
        **{
            "deepspeed.enabled": True,
            "deepspeed.zero_stage": 3,
            "train.iterations": 6,
            "train.prompts_per_iteration": 4,
            "output.export": False,
        },
    )
    refused = run_train(config, timeout=800)
    assert refused.returncode != 0
    assert "deepspeed.zero_stage" in refused.stderr and "deepspeed.zero_stage=2" in refused.stderr, refused.stderr[
        -3000:
    ]
    assert "Traceback" not in refused.stderr
    assert _files(out) == before  # the same paths with the same bytes: metrics.jsonl, the checkpoints, the marker


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("stage", "precision"), [(3, "fp32"), (2, "bf16")])
def test_other_stages_and_bf16_resume_from_two_ranks_on_one_with_the_same_optimiser_state(
    tiny_model, tmp_path, stage, precision
):
    # ZeRO-3 partitions the optimiser state as ZeRO-2 does (and the weights, which this tiny model
    # keeps whole); bf16 is the production precision: fp32 master weights beside bf16 module weights.
    _assert_resumed_with_the_same_optimiser_state(tiny_model, tmp_path, 2, 1, stage=stage, precision=precision)


class _OneFileDriver:
    """Writes and reads one file, and notes the world size it was asked to load (the manager's RNG
    handling is under test here; the DeepSpeed tests above load real optimiser state)."""

    def __init__(self) -> None:
        self.loaded_from: list[int] = []

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir()
        (directory / "torch" / "model.pt").write_bytes(b"weights")

    def load(self, directory: Path, saved: TrainerState) -> None:
        self.loaded_from.append(saved.world_size)


def _rng_after_load(root: Path, world_size: int, rank: int, driver: _OneFileDriver) -> tuple[torch.Tensor, float]:
    torch.manual_seed(99)  # whatever the process held before the resume
    random.seed(99)
    CheckpointManager(root, config_hash="abc", keep_last=2, rank=rank, world_size=world_size).load(
        root / "iter-000002", driver
    )
    return torch.get_rng_state(), random.random()


def test_rank_rng_files_are_restored_only_at_the_world_size_that_wrote_them(tmp_path):
    torch.manual_seed(5)
    random.seed(5)
    saved = torch.get_rng_state(), random.random()
    torch.manual_seed(5)
    random.seed(5)
    CheckpointManager(tmp_path, config_hash="abc", keep_last=2).save(
        TrainerState(2, 4, "abc", 1, "torch"), _OneFileDriver()
    )
    driver = _OneFileDriver()
    same = _rng_after_load(tmp_path, 1, 0, driver)
    assert torch.equal(same[0], saved[0]) and same[1] == saved[1]
    # At 2 ranks no rank takes rank 0's stream: each gets its own, the same on every resume.
    rank0, rank1, rank1_again = (_rng_after_load(tmp_path, 2, r, driver) for r in (0, 1, 1))
    assert not torch.equal(rank0[0], saved[0]) and not torch.equal(rank1[0], saved[0])
    assert not torch.equal(rank0[0], rank1[0]) and rank0[1] != rank1[1]
    assert torch.equal(rank1[0], rank1_again[0]) and rank1[1] == rank1_again[1]
    assert driver.loaded_from == [1, 1, 1, 1]  # the driver is told which world size saved it
