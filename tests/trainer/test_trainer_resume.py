"""Checkpoints and exact resume: a real training process is SIGKILLed mid-run (or mid-save) and
resumed; its final weights must equal an uninterrupted run's bit for bit (CPU, fp32,
deterministic algorithms, one thread)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch
from trainer_testlib import export_weights, run_train, tiny_overrides

from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.training.checkpoint import CheckpointManager, TrainerState, is_complete
from g2rpo.training.run_config import RunConfig, resume_hash
from g2rpo.training.trainer import Trainer
from g2rpo.training.validation import ValidationRecord, select_best
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ITERATIONS = 6


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("resume_tiny_flux"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("resume") / "uninterrupted"
    done = run_train(tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS}))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = export_weights(a), export_weights(b)
    assert wa.keys() == wb.keys()
    different = [k for k in wa if not torch.equal(wa[k], wb[k])]
    assert not different, different[:5]


def test_sigkill_mid_iteration_then_resume_is_bit_identical(tiny_model, uninterrupted, tmp_path):
    out = tmp_path / "killed"
    config = tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS})
    killed = run_train(config, fault="iteration:3")  # SIGKILL during iteration 3, after checkpoint 2
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert not (out / "export").exists()
    assert is_complete(out / "checkpoints" / "iter-000002")
    resumed = run_train({**config, "train": {**config["train"], "progress": True}})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # stderr is a pipe, as in a pod: the bar is whole lines from where the run resumed, and no
    # library draws one of carriage returns
    bars = [line for line in resumed.stderr.split("\n") if line.startswith("g2rpo train") and "|" in line]
    assert "\r" not in resumed.stderr and "Loading weights" not in resumed.stderr, resumed.stderr[-2000:]
    assert f"2/{ITERATIONS}" in bars[0] and f"{ITERATIONS}/{ITERATIONS}" in bars[-1], bars
    resumes = [e for e in _events(out) if e.get("event") == "resumed"]
    assert [e["iteration"] for e in resumes] == [2]
    _assert_same_weights(uninterrupted, out)
    # the resumed iterations drew the same prompts as the uninterrupted run
    first = {e["iteration"]: e["prompt_indices"] for e in _events(uninterrupted) if "prompt_indices" in e}
    second = {e["iteration"]: e["prompt_indices"] for e in _events(out) if "prompt_indices" in e}
    assert first == second


VALIDATED = {
    "train.iterations": ITERATIONS,
    "train.checkpoint_every": 100,  # only the validated iterations are checkpointed
    "train.keep_last": 1,
    "rewards.models": [
        {"name": "jpeg_compressibility"},
        {"name": "sharpness", "weight": 0.0},
        {"name": "total_variation", "weight": 0.0},
    ],
    # which validation is the best, and whether one breaches the held-out sharpness tolerance, depends
    # on the trajectory (it differs between CPUs): the test reads it from the runs' own records
    "train.validation": {
        "enabled": True,
        "every": 2,
        "num_prompts": 3,
        "seeds": [0, 1],
        "micro_batch": 4,
        "max_regression": {"sharpness": 0.001},
    },
}


def _validation_history(checkpoint: Path, with_seconds: bool = False) -> list[dict]:
    """The stored history, without the wall seconds (the one number a rerun cannot repeat) unless asked."""
    history = json.loads((checkpoint / "validation.json").read_text())["history"]
    return [{k: v for k, v in record.items() if with_seconds or k != "seconds"} for record in history]


def test_sigkill_with_validation_resumes_history_and_best_bit_identical(tiny_model, tmp_path):
    straight = tmp_path / "straight"
    assert run_train(tiny_overrides(tiny_model, straight, **VALIDATED)).returncode == 0
    out = tmp_path / "killed"
    config = tiny_overrides(tiny_model, out, **VALIDATED)
    killed = run_train(config, fault="iteration:5")  # after checkpoint 4, validations 0, 2 and 4 recorded
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # keep_last 1 keeps the newest (4) and the best validated one so far, whichever that is on this machine
    recorded = [ValidationRecord.from_json(r) for r in _validation_history(out / "checkpoints" / "iter-000004", True)]
    assert [r.iteration for r in recorded] == [0, 2, 4]
    best_so_far = select_best(recorded).iteration
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == sorted({"iter-000004", f"iter-{best_so_far:06d}"})
    resumed = run_train(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # the resumed run's history (baseline and best-so-far included) is the uninterrupted one's
    final = "iter-000006"
    assert _validation_history(out / "checkpoints" / final) == _validation_history(straight / "checkpoints" / final)
    assert [r["iteration"] for r in _validation_history(out / "checkpoints" / final)] == [0, 2, 4, 6]
    # validation ran after the resume only where the killed run had not recorded it (6), never 0 again
    validated = [e["iteration"] for e in _events(out) if e.get("event") == "validation"]
    assert validated == [0, 2, 4, 6]
    # both export the same selection, the one the recorded history gives
    history = [ValidationRecord.from_json(r) for r in _validation_history(straight / "checkpoints" / final, True)]
    selection = select_best(history)
    for run in (straight, out):
        info = json.loads((run / "export" / "base_model.json").read_text())
        assert (info["selected_iteration"], info["selection_reason"]) == (selection.iteration, selection.reason), info
    _assert_same_weights(straight, out)


def test_lora_sigkill_then_resume_equals_an_uninterrupted_run(tiny_model, tmp_path):
    # The LoRA adapters alone train (and are checkpointed); their initial values come from the
    # run seed, so the uninterrupted run and the killed-and-resumed one start alike too.
    from safetensors.torch import load_file

    extra = {"train.iterations": 4, "train.lora.enabled": True}
    adapters = {}
    for name, fault in (("straight", None), ("killed", "iteration:3")):
        config = tiny_overrides(tiny_model, tmp_path / name, **extra)
        if fault:
            killed = run_train(config, fault=fault)
            assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
            assert not (tmp_path / name / "export").exists()
        done = run_train(config)
        assert done.returncode == 0, done.stderr[-3000:]
        (weights,) = (tmp_path / name / "export" / "lora").glob("*.safetensors")
        adapters[name] = load_file(str(weights))
    assert [e["iteration"] for e in _events(tmp_path / "killed") if e.get("event") == "resumed"] == [2]
    assert adapters["straight"].keys() == adapters["killed"].keys() and adapters["straight"]
    different = [k for k in adapters["straight"] if not torch.equal(adapters["straight"][k], adapters["killed"][k])]
    assert not different, different[:5]


def test_kill_while_saving_leaves_an_incomplete_checkpoint_that_is_ignored(tiny_model, uninterrupted, tmp_path):
    out = tmp_path / "killed-saving"
    config = tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS})
    killed = run_train(config, fault="checkpoint:4")  # weights of checkpoint 4 written, manifest not
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    partial = out / "checkpoints" / "iter-000004"
    assert partial.is_dir() and any(partial.rglob("*.pt")) and not is_complete(partial)
    resumed = run_train(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [e["iteration"] for e in _events(out) if e.get("event") == "resumed"] == [2]
    assert is_complete(out / "checkpoints" / "iter-000004")  # rewritten by the resumed run
    _assert_same_weights(uninterrupted, out)


def _flip_64_bytes(path: Path) -> bytes:
    """Invert 64 bytes in the middle of ``path`` (its size stays the same); returns the new content."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))
    return bytes(data)


def test_damaged_latest_checkpoint_is_skipped_and_the_run_resumes_from_the_previous_one(
    tiny_model, uninterrupted, tmp_path
):
    out = tmp_path / "damaged"
    config = tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS})
    killed = run_train(config, fault="iteration:5")  # SIGKILL after checkpoint 4
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    latest = out / "checkpoints" / "iter-000004"
    damaged = _flip_64_bytes(latest / "torch" / "model.pt")
    assert is_complete(latest)  # present with every size right: only the digests tell
    resumed = run_train(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    skipped = [e for e in _events(out) if e.get("event") == "checkpoint_skipped"]
    assert [Path(e["path"]).name for e in skipped] == ["iter-000004"]
    assert "torch/model.pt" in skipped[0]["reason"] and Path(skipped[0]["resuming_from"]).name == "iter-000002"
    assert "skipping checkpoint" in resumed.stderr and "iter-000004" in resumed.stderr
    assert [e["iteration"] for e in _events(out) if e.get("event") == "resumed"] == [2]
    # the damaged copy is kept aside, untouched; iteration 4 was written afresh by the resumed run
    assert (out / "checkpoints" / "iter-000004.damaged" / "torch" / "model.pt").read_bytes() == damaged
    assert is_complete(latest)
    _assert_same_weights(uninterrupted, out)


def test_resume_from_another_config_hash_is_refused_naming_both(tiny_model, uninterrupted, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(uninterrupted, out, ignore=shutil.ignore_patterns("export"))
    changed = load_config(
        RunConfig, None, tiny_overrides(tiny_model, out, **{"train.iterations": 8, "algorithm.group_size": 3})
    )
    original = load_config(RunConfig, None, tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS}))
    written = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(G2RPOError) as info:
        Trainer(changed).setup()
    message = str(info.value)
    assert resume_hash(changed) in message and resume_hash(original) in message
    assert "fresh output.dir" in message
    # nothing already written is lost or changed by the refusal (files, bytes, no new files)
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == written
    # run length and output paths are not part of the hash: a longer run of the same config resumes
    longer = load_config(RunConfig, None, tiny_overrides(tiny_model, out, **{"train.iterations": 8}))
    assert resume_hash(longer) == resume_hash(original)
    trainer = Trainer(longer).setup()
    assert trainer.iteration == ITERATIONS


def test_resume_never_refuses_a_used_output_dir(tiny_model, uninterrupted):
    config = load_config(RunConfig, None, tiny_overrides(tiny_model, uninterrupted, **{"train.resume": "never"}))
    with pytest.raises(G2RPOError, match="already holds a run"):
        Trainer(config).setup()


class _FileDriver:
    """A stand-in for the optimiser driver that writes one file (the manager's logic is under test)."""

    def save(self, directory: Path) -> None:
        (directory / "torch").mkdir()
        (directory / "torch" / "model.pt").write_bytes(b"weights")

    def load(self, directory: Path, saved: TrainerState) -> None:
        pass


def test_retention_keeps_last_n_and_named_and_never_overwrites(tmp_path):
    manager = CheckpointManager(tmp_path, config_hash="abc", keep_last=2, keep_iterations=[2])
    for it in (2, 4, 6, 8):
        manager.save(TrainerState(it, it * 2, "abc", 1, "torch"), _FileDriver())
    assert [i for i, _ in manager.complete()] == [2, 6, 8]  # last 2 + the named 2
    with pytest.raises(G2RPOError, match="refusing to overwrite"):
        manager.save(TrainerState(8, 16, "abc", 1, "torch"), _FileDriver())
    # a truncated file makes a checkpoint incomplete: latest() falls back to the previous one
    (tmp_path / "iter-000008" / "torch" / "model.pt").write_bytes(b"w")
    assert manager.latest() == tmp_path / "iter-000006"
    with pytest.raises(G2RPOError, match="incomplete"):
        manager.read_state(tmp_path / "iter-000008")


@pytest.mark.slow
def test_deepspeed_zero2_sigkill_resume_is_bit_identical(tiny_model, tmp_path):
    # The same as above through DeepSpeed's own checkpoints (engine.save/load_checkpoint):
    # three DeepSpeed starts (~10 s each once its comm op is compiled).
    extra = {"train.iterations": ITERATIONS, "deepspeed.enabled": True}
    straight = tmp_path / "straight"
    assert run_train(tiny_overrides(tiny_model, straight, **extra), timeout=800).returncode == 0
    out = tmp_path / "killed"
    config = tiny_overrides(tiny_model, out, **extra)
    assert run_train(config, fault="iteration:3", timeout=800).returncode == -signal.SIGKILL
    assert (out / "checkpoints" / "iter-000002" / "deepspeed" / "state").is_dir()
    done = run_train(config, timeout=800)
    assert done.returncode == 0, done.stderr[-3000:]
    assert [e["iteration"] for e in _events(out) if e.get("event") == "resumed"] == [2]
    _assert_same_weights(straight, out)


def test_digest_check_falls_back_names_the_damage_and_refuses_when_nothing_matches(tmp_path):
    manager = CheckpointManager(tmp_path, config_hash="abc", keep_last=3)
    for it in (2, 4, 6):
        manager.save(TrainerState(it, it * 2, "abc", 1, "torch"), _FileDriver())
    for it in (4, 6):
        (tmp_path / f"iter-{it:06d}" / "torch" / "model.pt").write_bytes(b"WEIGHTS")  # same size
    with pytest.raises(G2RPOError, match="sha256") as info:
        CheckpointManager(tmp_path, config_hash="abc", keep_last=3).read_state(tmp_path / "iter-000006")
    assert "torch/model.pt" in str(info.value)
    skipped: list[dict] = []
    fresh = CheckpointManager(tmp_path, config_hash="abc", keep_last=3)
    assert fresh.latest_verified(skipped.append) == tmp_path / "iter-000002"
    assert [(Path(e["path"]).name, Path(e["moved_to"]).name) for e in skipped] == [
        ("iter-000006", "iter-000006.damaged"),
        ("iter-000004", "iter-000004.damaged"),
    ]
    assert [i for i, _ in fresh.complete()] == [2]
    assert fresh.read_state(tmp_path / "iter-000002").iteration == 2
    # nothing matches: an error listing each checkpoint, and nothing is moved
    (tmp_path / "iter-000002" / "torch" / "model.pt").write_bytes(b"WEIGHTS")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(G2RPOError, match="no checkpoint in .* matches") as info:
        CheckpointManager(tmp_path, config_hash="abc", keep_last=3).latest_verified()
    assert "iter-000002" in str(info.value) and "new output.dir" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
