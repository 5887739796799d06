"""`g2rpo eval` sharded over 2 ranks under torchrun (gloo on the CPU) publishes the one artifact a
single process publishes, with every (prompt, seed) image sampled once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g2rpo.artifacts.manifest import verify
from g2rpo.artifacts.storage import open_store
from g2rpo.evaluation import resume

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
PROMPTS = REPO / "configs" / "tiny-prompts.txt"
SEEDS = [0, 1]
NUM_PROMPTS = 3
# 3 prompts × 2 seeds in chunks of 2: 3 chunks, dealt round robin as 2 to rank 0 and 1 to rank 1.
CHUNK_SIZE = 2
TEXT_FILES = ("scores.json", "scores.jsonl", "metrics.json", "prompts.json")


def _env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop(resume.FAIL_POINT_ENV, None)
    return env


def _eval(launcher: list[str], model: Path, out: Path) -> subprocess.CompletedProcess:
    argv = [*launcher, "-m", "g2rpo", "eval", "--model", str(model), "--prompts", str(PROMPTS)]
    argv += ["--output", str(out), "--seeds", ",".join(map(str, SEEDS)), "--steps", "2"]
    argv += [
        "--metrics",
        "jpeg_compressibility",
        f"num_prompts={NUM_PROMPTS}",
        f"chunk_size={CHUNK_SIZE}",
        "device=cpu",
    ]
    done = subprocess.run(argv, env=_env(), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


def test_two_ranks_publish_what_one_process_publishes_sampling_each_image_once(tiny_flux_dir, tmp_path):
    torchrun = str(Path(sys.executable).parent / "torchrun")
    sharded = _eval([torchrun, "--standalone", "--nproc_per_node", "2"], tiny_flux_dir, tmp_path / "sharded")
    single = _eval([sys.executable], tiny_flux_dir, tmp_path / "single")

    # rank 0 (the only one that reports progress) sampled two of the three chunks, so rank 1 had
    # the third; both ranks print the total of all ranks: the 6 images, none sampled twice
    log = sharded.stderr
    assert "(1/2 on this rank)" in log and "(2/2 on this rank)" in log and "(3/" not in log, log[-4000:]
    assert "chunk T2_c00000: 2 image(s)" in log and "chunk T2_c00002: 2 image(s)" in log
    assert "chunk T2_c00001" not in log
    assert sharded.stdout.count("6 image(s) sampled by this run") == 2, sharded.stdout
    assert single.stdout.count("6 image(s) sampled by this run") == 1

    sharded_store, single_store = open_store(str(tmp_path / "sharded")), open_store(str(tmp_path / "single"))
    manifest = verify(sharded_store, deep=True)
    assert not sharded_store.list(resume.PARTIAL)  # the partial chunks are removed after the publish
    lines = [json.loads(line) for line in (tmp_path / "sharded" / "scores.jsonl").read_text().splitlines()]
    assert sorted((line["prompt_id"], line["seed"]) for line in lines) == [
        (f"p{p}", seed) for p in range(NUM_PROMPTS) for seed in SEEDS
    ]  # each (prompt, seed) exactly once

    # the same artifact: every file byte for byte but the report, which names its own output URI
    # (and the manifest, whose metadata and times differ)
    digests = {entry.path: entry.sha256 for entry in manifest.files}
    assert digests == {entry.path: entry.sha256 for entry in verify(single_store, deep=True).files} | {
        "report.html": digests["report.html"]
    }
    for name in TEXT_FILES:  # spelled out, so a difference shows in the assertion
        assert (tmp_path / "sharded" / name).read_text() == (tmp_path / "single" / name).read_text(), name
    report = (tmp_path / "sharded" / "report.html").read_text()
    assert str(tmp_path / "sharded") in report
    assert (
        report.replace(str(tmp_path / "sharded"), str(tmp_path / "single"))
        == (tmp_path / "single" / "report.html").read_text()
    )
    assert len(json.loads((tmp_path / "sharded" / "scores.json").read_text())["items"]) == NUM_PROMPTS * len(SEEDS)
