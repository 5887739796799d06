"""What the steps read back, damaged: a scores file given by the user (a FIFO, a directory, not UTF-8),
a task's record.json, a partial evaluation's state and chunk records — each refused naming the file,
what is wrong and the fix, never a traceback (docs/errors.md)."""

from __future__ import annotations

import os

import pytest
from steps_helpers import PROMPTS, REPO, make_scores

from g2rpo.artifacts.manifest import read_manifest
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import G2RPOError
from g2rpo.evaluation import resume
from g2rpo.steps.records import CandidatesRecord, read_record
from g2rpo.steps.register import read_scores
from g2rpo.steps.train import PublishedExport, TrainResult
from g2rpo.steps.train_task import train_task


def test_a_scores_path_that_is_not_a_utf8_file_is_named(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(G2RPOError, match=r"--scores='.*pipe\.json': scores file .* is a FIFO \(named pipe\)"):
        read_scores(str(tmp_path / "pipe.json"), field="--scores")  # never opened: it would block
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(G2RPOError, match=r"is a directory, not a regular file: pass the eval's per-prompt scores"):
        read_scores(str(tmp_path / "dir.json"), field="--scores")
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(make_scores({"jpeg": -5.0}).model_dump_json().replace("p0", "p\xe9").encode("latin-1"))
    with pytest.raises(G2RPOError, match=r"the scores file: line 1, column \d+: byte 0xe9 is not UTF-8"):
        read_scores(str(latin1), field="--scores")
    cut = tmp_path / "cut.json"
    cut.write_text(make_scores({"jpeg": -5.0}).model_dump_json()[:40])
    with pytest.raises(G2RPOError, match=r"not valid JSON .*ends early.*docs/registry\.md"):
        read_scores(str(cut), field="--scores")


def test_a_task_record_that_is_not_utf8_is_named(tmp_path):
    (tmp_path / "record.json").write_bytes(b'{"challenger_eval_uri": "\xff"}')
    with pytest.raises(
        G2RPOError, match=r"record=.*record\.json: line 1, column 26: byte 0xff is not UTF-8.*run the task"
    ):
        read_record(CandidatesRecord, tmp_path)
    (tmp_path / "record.json").write_text('{"challenger_eval_uri": 3}')
    with pytest.raises(G2RPOError, match=r"is not a valid CandidatesRecord \(challenger_eval_uri: Input should be"):
        read_record(CandidatesRecord, tmp_path)


def _state() -> resume.PartialState:
    return resume.PartialState(
        model_uri="m",
        model_digest=None,
        prompt_set="p",
        prompt_set_sha256="0" * 64,
        prompts=["a red circle"],
        seeds=[0],
        step_counts=[4],
        metrics=["jpeg"],
        sampling={},
    )


def test_a_partial_evaluation_changed_on_disk_is_named_with_the_fix(tmp_path):
    store = open_store(str(tmp_path / "eval"))
    assert resume.open_state(store, _state(), "out") is False
    key = f"{resume.PARTIAL}/state.json"
    store.put_bytes(key, store.get_bytes(key)[0][:30])
    with pytest.raises(G2RPOError, match=r"state\.json: line \d+, column \d+: not valid JSON .*delete .*_partial"):
        resume.open_state(store, _state(), "out")
    store.put_bytes(f"{resume.PARTIAL}/chunks/T4_c0.json", b'{"chunk": "T4_c0", "items": [{"seed": "x"}]}')
    with pytest.raises(
        G2RPOError, match=r"T4_c0\.json is not a valid ChunkRecord \(items\.0\..*delete it to have that"
    ):
        resume.read_chunk(store, "T4_c0")


@pytest.mark.parametrize(
    ("base_model_json", "problem"),
    [
        (b'{"base_model": "tiny", "license": {"na', r"line 1, column \d+: not valid JSON .* it ends early"),
        (b'{"base_model": "tiny"}', r"is not a valid ExportInfo \(license: Field required\)"),
    ],
)
def test_a_trainjobs_export_without_a_sound_base_model_json_is_named(tmp_path, monkeypatch, base_model_json, problem):
    # What a TrainJob published (its pods wrote the export; this task only reads it back): the launch is
    # replaced, since no Kubernetes runs here; the task's reading of the export is the real one.
    export = tmp_path / "export"
    (export / "transformer").mkdir(parents=True)
    (export / "transformer" / "diffusion_pytorch_model.safetensors").write_bytes(os.urandom(64))
    (export / "base_model.json").write_bytes(base_model_json)
    uri = (tmp_path / "store" / "exports" / "model-1").as_uri()
    publish_dir(export, uri, producer="g2rpo train", config_hash="h")
    published = PublishedExport(uri=uri, manifest=read_manifest(open_store(uri)))

    def trainjob(config, **kwargs) -> TrainResult:
        work = tmp_path / "work"
        return TrainResult({}, work, work / "metrics.jsonl", work / "checkpoints", None, "h", published, "job-1")

    monkeypatch.setattr("g2rpo.steps.train_task.train_and_publish", trainjob)
    with pytest.raises(G2RPOError, match=rf"model-1/base_model\.json:? {problem}.*run the pipeline again"):
        train_task(
            str(REPO / "configs" / "tiny-cpu.yaml"),
            {"iterations": 1},
            prompts=str(PROMPTS),
            base_model_uri=str(tmp_path / "tiny-flux"),
            publish_uri=(tmp_path / "store" / "exports").as_uri(),
            record_dir=tmp_path / "record",
            work_dir=tmp_path / "work",
            nodes=2,
            checkpoint_uri="s3://b/c",
            prompts_uri="s3://b/prompts.txt",  # where the job's pods would read them (the launch is replaced)
        )  # was a JSONDecodeError / KeyError
    assert not (tmp_path / "record" / "record.json").exists()
