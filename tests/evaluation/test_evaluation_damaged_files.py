"""An evaluation's JSON files read back damaged or mis-shaped — a baseline's or a published evaluation's
prompts.json, scores.jsonl, grid/index.json and manifest, an export's base_model.json, a partial
evaluation's policy.json — are refused naming the file, what is wrong and the fix, never a
KeyError/JSONDecodeError traceback (docs/errors.md).

A published evaluation's files are checked against its manifest before they are read, so the damage
here is sealed with a fresh manifest, as an artifact published that way (or by another tool) would be.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from g2rpo.artifacts.manifest import MANIFEST_NAME, read_manifest, write_dir_manifest
from g2rpo.artifacts.storage import FileStore, open_store
from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.evaluation import resume
from g2rpo.evaluation.artifact import grid_page_files, load_baseline, load_evaluation
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.policy import load_policy
from g2rpo.steps.evaluate import evaluate

pytestmark = pytest.mark.integration

FIX = r"the evaluation .* was published with it: evaluate again into a new output_uri"


def _config() -> EvaluationConfig:
    values = {
        "prompts": "builtin:tiny",
        "num_prompts": 2,
        "seeds": [0],
        "num_steps": 2,
        "rewards": {"models": [{"name": "jpeg_compressibility"}]},
        "device": "cpu",
    }
    return load_config(EvaluationConfig, None, values)


@pytest.fixture(scope="module")
def published(tiny_flux_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("damaged-eval") / "eval"
    evaluate(str(tiny_flux_dir), _config(), str(out))
    return out


def _resealed(source: Path, folder: Path, files: dict[str, bytes | None], metadata: dict | None = None) -> Path:
    """A copy of the artifact ``source`` with ``files`` replaced (None: removed), sealed with a new manifest."""
    shutil.copytree(source, folder)
    manifest = read_manifest(FileStore(folder))
    for name, data in files.items():
        if data is None:
            (folder / name).unlink()
        else:
            (folder / name).write_bytes(data)
    (folder / MANIFEST_NAME).unlink()
    write_dir_manifest(
        folder,
        producer=manifest.producer,
        config_hash=manifest.config_hash,
        metadata=manifest.metadata if metadata is None else metadata,
    )
    return folder


def test_a_baseline_whose_prompts_or_scores_lines_are_mis_shaped_is_named_with_the_fix(published, tmp_path):
    prompts = json.loads((published / "prompts.json").read_text())
    del prompts["prompts"][1]["prompt"]
    broken = _resealed(published, tmp_path / "no-prompt", {"prompts.json": json.dumps(prompts).encode()})
    with pytest.raises(
        G2RPOError,
        match=rf"no-prompt/prompts\.json' is not a valid PromptsDocument \(prompts\.1\.prompt: Field required\): {FIX}",
    ):
        load_baseline(str(broken))  # was a KeyError

    lines = (published / "scores.jsonl").read_bytes().splitlines(keepends=True)
    cut = b"".join(lines[:-1]) + lines[-1][:25]  # a last line cut short
    broken = _resealed(published, tmp_path / "cut-line", {"scores.jsonl": cut})
    with pytest.raises(
        G2RPOError,
        match=rf"line 2 of evaluation file .*scores\.jsonl': line 1, column \d+: not valid JSON .* it ends early.*{FIX}",
    ):
        load_baseline(str(broken))  # was a JSONDecodeError


def test_an_old_baseline_without_scores_jsonl_needs_its_step_count_in_the_manifest(published, tmp_path):
    broken = _resealed(published, tmp_path / "old", {"scores.jsonl": None}, metadata={"kind": "evaluation"})
    with pytest.raises(G2RPOError, match=r"manifest records no metadata\.config\.num_steps \(found None\)"):
        load_baseline(str(broken))  # was a KeyError
    manifest = read_manifest(FileStore(published))
    fine = _resealed(published, tmp_path / "old-fine", {"scores.jsonl": None}, metadata=manifest.metadata)
    assert sorted(load_baseline(str(fine)).by_steps) == [2]


def test_a_published_evaluation_whose_prompts_are_an_array_is_named(published, tmp_path):
    broken = _resealed(published, tmp_path / "array", {"prompts.json": b'["a red circle", "a blue square"]\n'})
    with pytest.raises(G2RPOError, match=rf"array/prompts\.json' holds an array where an object belongs: {FIX}"):
        load_evaluation(str(broken))  # was a TypeError
    assert len(load_evaluation(str(published)).prompts) == 2


def test_a_grid_index_without_page_files_is_named(published, tmp_path):
    assert grid_page_files(open_store(str(published))) == ["grid/page-001.png"]
    broken = _resealed(published, tmp_path / "grid", {"grid/index.json": b'{"pages": [{"name": "page-001.png"}]}'})
    with pytest.raises(G2RPOError, match=r"grid/index\.json is not a valid GridIndex \(pages\.0\.file: Field required"):
        grid_page_files(open_store(str(broken)))  # was a KeyError


def test_an_export_whose_base_model_json_is_utf16_is_named(tiny_flux_dir, tmp_path):
    export = tmp_path / "export"
    (export / "transformer").mkdir(parents=True)
    (export / "base_model.json").write_bytes(json.dumps({"base_model": "tiny"}).encode("utf-16"))
    write_dir_manifest(export, producer="g2rpo.training.trainer.export test")
    with pytest.raises(
        G2RPOError, match=r"base_model\.json' is UTF-16 .*not UTF-8: the export is damaged: export it again"
    ):
        load_policy(str(export), _config(), base_model_uri=str(tiny_flux_dir))


def test_a_partial_evaluations_damaged_policy_record_is_named_when_it_is_assembled(
    tiny_flux_dir, tmp_path, monkeypatch
):
    out = tmp_path / "eval"

    def preempted(*args, **kwargs):
        raise KeyboardInterrupt  # the pod is lost after every chunk was scored, before the artifact was assembled

    monkeypatch.setattr("g2rpo.steps.evaluate.assemble", preempted)
    with pytest.raises(KeyboardInterrupt):
        evaluate(str(tiny_flux_dir), _config(), str(out))
    monkeypatch.undo()
    store = open_store(str(out))
    key = f"{resume.PARTIAL}/policy.json"
    store.put_bytes(key, store.get_bytes(key)[0][:20])
    # every chunk is scored, so the rerun samples nothing and reads the record an earlier process wrote
    with pytest.raises(
        G2RPOError, match=r"_partial/policy\.json: line 1, column \d+: not valid JSON .*ends early.*delete .*_partial"
    ):
        evaluate(str(tiny_flux_dir), _config(), str(out))  # was a JSONDecodeError
    shutil.rmtree(out / resume.PARTIAL)
    assert evaluate(str(tiny_flux_dir), _config(), str(out)).manifest.metadata["policy_kind"] == "pipeline"
