"""One writer per run folder: a second process is refused naming the holder; a dead holder's claim is taken over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.training.run_dir import WRITER, claim_run_dir

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
