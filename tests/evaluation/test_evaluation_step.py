"""steps.evaluate on the real tiny Flux: the published artifact, reading it back, `g2rpo eval`, S3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from g2rpo import cli
from g2rpo.artifacts.manifest import MARKER_NAME, verify
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import open_store
from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.artifact import load_evaluation
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.sampling import save_before_after_grid
from g2rpo.steps.evaluate import evaluate

pytestmark = pytest.mark.integration

PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "tiny-prompts.txt"
PNG = b"\x89PNG\r\n\x1a\n"
EXPECTED_FILES = {
    "scores.json",
    "metrics.json",
    "prompts.json",
    "grid.png",
    "grid/page-001.png",
    "grid/index.json",
    "images/p0_s0.png",
    "images/p0_s5.png",
    "images/p1_s0.png",
    "images/p1_s5.png",
    "scores.jsonl",
    "report.html",
    "plots/distribution_jpeg_compressibility.png",
    "plots/distribution_sharpness.png",
}


def _config(prompts: str = str(PROMPTS), **extra) -> EvaluationConfig:
    values = {
        "prompts": prompts,
        "num_prompts": 2,
        "seeds": [0, 5],
        "num_steps": 3,
        "rewards": {"models": [{"name": "jpeg_compressibility"}, {"name": "sharpness"}]},
        "device": "cpu",
        **extra,
    }
    return load_config(EvaluationConfig, None, values)


@pytest.fixture(scope="module")
def published(tiny_flux_dir, tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("eval") / "base-eval")
    return evaluate(str(tiny_flux_dir), _config(), uri)


def test_artifact_has_a_manifest_naming_every_file(published):
    store = open_store(published.output_uri)
    manifest = verify(store, deep=True)  # every file there with its size and sha256
    assert {entry.path for entry in manifest.files} == EXPECTED_FILES
    assert {info.key for info in store.list()} == EXPECTED_FILES | {"manifest.json"}  # no marker left behind
    assert not store.exists(MARKER_NAME)
    assert manifest.metadata["policy_kind"] == "pipeline" and manifest.metadata["config"]["num_steps"] == 3
    assert store.get_bytes("grid.png")[0].startswith(PNG)


def test_scores_round_trip_through_the_artifact(published):
    root = Path(published.output_uri)
    stored = EvalScores.model_validate_json((root / "scores.json").read_text())
    assert stored == published.scores
    assert stored.seeds == [0, 5] and len(stored.items) == 4 and stored.prompt_set == str(PROMPTS)
    assert set(stored.metric_names()) == {"jpeg_compressibility", "sharpness"}
    prompts = json.loads((root / "prompts.json").read_text())
    assert [p["prompt"] for p in prompts["prompts"]] == PROMPTS.read_text().splitlines()[:2]

    loaded = load_evaluation(published.output_uri)
    live = published.evaluation
    assert loaded.prompts == live.prompts and loaded.seeds == live.seeds
    for name in live.scores:
        assert torch.equal(loaded.scores[name], live.scores[name])  # float32 → JSON → float32: exact
    # the result's images are the published PNGs themselves
    assert loaded.images.shape == live.images.shape == (2, 2, 3, 64, 64)
    assert torch.equal(loaded.images, live.images)


def test_metrics_are_mean_std_and_n_of_the_scores(published):
    document = json.loads((Path(published.output_uri) / "metrics.json").read_text())
    assert document["num_steps"] == 3 and document["step_counts"] == [3]
    metrics = document["by_steps"]["3"]
    for name, values in published.evaluation.scores.items():
        flat = [float(v) for v in values.flatten()]
        mean = sum(flat) / 4
        std = (sum((v - mean) ** 2 for v in flat) / 3) ** 0.5  # sample std, n − 1 = 3
        assert metrics[name]["n"] == 4
        assert metrics[name]["mean"] == pytest.approx(mean, abs=1e-9) == published.means[name]
        assert metrics[name]["std"] == pytest.approx(std, abs=1e-9)
        assert metrics[name]["ci_low"] <= metrics[name]["mean"] <= metrics[name]["ci_high"]


def test_same_model_same_scores_and_two_evaluations_draw_a_before_after_grid(published, tiny_flux_dir, tmp_path):
    again = evaluate(str(tiny_flux_dir), _config(), str(tmp_path / "again"))
    assert again.scores == published.scores  # the same (prompt, seed) gives the same image and score
    grid = save_before_after_grid(
        load_evaluation(published.output_uri), load_evaluation(again.output_uri), tmp_path / "ba.png"
    )
    assert grid.read_bytes().startswith(PNG)


def test_an_output_that_is_already_published_is_refused_before_sampling(published, tiny_flux_dir):
    with pytest.raises(G2RPOError) as info:
        evaluate(str(tiny_flux_dir), _config(), published.output_uri)
    assert "output_uri=" in str(info.value) and "choose a new URI" in str(info.value)


def test_g2rpo_eval_command(tiny_flux_dir, tmp_path, capsys):
    out = tmp_path / "cli-eval"
    argv = ["eval", "--model", str(tiny_flux_dir), "--prompts", str(PROMPTS), "--output", str(out)]
    argv += ["--seeds", "0,5", "--steps", "3", "--metrics", "jpeg_compressibility,sharpness"]
    assert cli.main(argv + ["num_prompts=2", "device=cpu"]) == 0
    printed = capsys.readouterr().out
    assert "jpeg_compressibility" in printed and "mean" in printed and str(out) in printed
    assert EvalScores.model_validate_json((out / "scores.json").read_text()).seeds == [0, 5]

    # bad input: exit status 2 and the field, value and fix; nothing published
    assert cli.main(argv[:-4] + ["--output", str(tmp_path / "bad"), "--seeds", "0,0", "device=cpu"]) == 2
    assert "seeds=[0, 0]: list each seed once" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
    assert cli.main(["eval", "--describe"]) == 0
    assert "num_steps (integer ≥ 1, ≤ 1000; default 16)" in capsys.readouterr().out


def test_model_prompts_and_output_on_s3(s3_env, tiny_flux_dir, published, tmp_path, monkeypatch):
    monkeypatch.setenv("G2RPO_CACHE_DIR", str(tmp_path / "cache"))
    model_uri = f"{s3_env.uri}/models/tiny"
    publish_dir(tiny_flux_dir, model_uri)
    open_store(f"{s3_env.uri}/data").put_file("prompts.txt", PROMPTS)
    output = f"{s3_env.uri}/evals/base"
    result = evaluate(model_uri, _config(prompts=f"{s3_env.uri}/data/prompts.txt"), output)
    manifest = verify(open_store(output), deep=True)
    assert {entry.path for entry in manifest.files} == EXPECTED_FILES
    loaded = load_evaluation(output)
    # the model from S3 is the local one: the same scores as the local evaluation
    assert loaded.scores.keys() == published.evaluation.scores.keys()
    for name, values in published.evaluation.scores.items():
        assert torch.equal(loaded.scores[name], values)
    assert result.scores.prompt_set == f"{s3_env.uri}/data/prompts.txt"
    assert result.scores.prompt_set_sha256 == published.scores.prompt_set_sha256  # same file bytes
