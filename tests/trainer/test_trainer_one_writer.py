"""One writer per run folder: a second process is refused naming the holder; a dead holder's claim is taken over;
the trainer's setup is the one place that claims, once, and a setup that fails gives the claim back."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_testlib import tiny_overrides

from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.training.callbacks import TrainerCallback
from g2rpo.training.run_config import RunConfig
from g2rpo.training.run_dir import MARKER, WRITER, claim_run_dir
from g2rpo.training.trainer import Trainer
from tests.tiny_flux_fixture import make_tiny_flux

REPO = Path(__file__).resolve().parents[2]

HOLDER = """
import sys, time
from g2rpo.training.run_dir import claim_run_dir
claim_run_dir(sys.argv[1], "hash")
print("claimed", flush=True)
time.sleep(120)
"""


def test_a_second_process_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(G2RPOError) as refused:
            claim_run_dir(out, "hash")
        message = str(refused.value)
        assert f"pid {holder.pid}" in message and "another g2rpo train is writing there" in message
        assert "choose another output.dir" in message
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    time.sleep(0.1)
    claim = claim_run_dir(out, "hash")  # the holder is gone: taken over
    try:
        assert f'"pid": {os.getpid()}' in (out / WRITER).read_text()
    finally:
        claim.release()
    assert not (out / WRITER).exists()


class _WritesBeforeResume(TrainerCallback):
    """What the S3 mirror does in setup: claim output.dir, then write there (here: note who holds it)."""

    def __init__(self, fail: bool = False) -> None:
        self.holders: list[int] = []
        self.fail = fail

    def before_resume(self, trainer: Trainer) -> None:
        trainer.claim_output_dir()
        trainer.claim_output_dir()  # once per setup: the second call keeps the first claim
        self.holders.append(json.loads((trainer.out / WRITER).read_text())["pid"])
        if self.fail:  # e.g. the S3 mirror's restore: a setup that fails after its claim
            raise G2RPOError("restore failed")


@pytest.mark.integration
def test_the_trainer_claims_once_and_a_failed_setup_gives_the_claim_back(tmp_path):
    model = make_tiny_flux(tmp_path / "tiny")
    for name in ("existing", "new"):
        out = tmp_path / name
        if name == "existing":
            out.mkdir()  # claimed at the start of setup; a new folder when first written (by the callback here)
        # the config passes every check before setup's claim (a bad LoRA target no longer does: validate
        # refuses it), so the failure comes after the claim, from the callback's restore
        callback = _WritesBeforeResume(fail=True)
        with pytest.raises(G2RPOError, match="restore failed"):
            Trainer(load_config(RunConfig, None, tiny_overrides(model, out)), [callback]).setup()
        assert callback.holders == [os.getpid()], name
        assert (out / MARKER).is_file() and not (out / WRITER).exists(), name
    trainer = Trainer(load_config(RunConfig, None, tiny_overrides(model, tmp_path / "existing"))).setup()
    try:
        assert len(trainer.claims) == 1 and (tmp_path / "existing" / WRITER).is_file()
    finally:
        trainer.release_claims()
    assert not (tmp_path / "existing" / WRITER).exists()
