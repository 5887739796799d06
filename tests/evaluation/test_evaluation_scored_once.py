"""A model is scored once per settings (g2rpo.evaluation.identity, steps.evaluate.evaluate_once): on the
real tiny Flux, published with a manifest so its bytes have a name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.scores import paired_differences
from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.evaluation.identity import IDENTITY_KEY, content_digest
from g2rpo.steps.evaluate import evaluate_once

pytestmark = pytest.mark.integration

PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "tiny-prompts.txt"


def _config(**extra) -> EvaluationConfig:
    values = {
        "prompts": str(PROMPTS),
        "num_prompts": 2,
        "seeds": [0, 5],
        "num_steps": 2,
        "rewards": {"models": [{"name": "jpeg_compressibility"}]},
        "device": "cpu",
        **extra,
    }
    return load_config(EvaluationConfig, None, values)


@pytest.fixture(scope="module")
def models(tiny_flux_dir, tmp_path_factory) -> tuple[str, str]:
    """The tiny Flux published twice, at two places: the same bytes."""
    root = tmp_path_factory.mktemp("models")
    first, second = str(root / "a"), str(root / "b")
    publish_dir(tiny_flux_dir, first)
    publish_dir(tiny_flux_dir, second)
    return first, second


def test_a_model_is_scored_once_per_settings_and_read_back_after(models, tmp_path, capsys):
    first, copy = models
    evaluations = str(tmp_path / "evaluations")
    scored = evaluate_once(first, _config(), evaluations, label="base model", progress=True)
    assert scored.generated == 4 and "/scored/" in scored.output_uri
    err = capsys.readouterr().err
    # every chunk says how far the evaluation is, under its label
    assert "[evaluate base model " in err and "; 4/4 images" in err
    # and the assembly, seconds of figures, says each part as it is drawn, then the publish
    assert err.index("distribution plot(s) drawn") < err.index("grid page 1/1 drawn") < err.index("report.html written")
    assert err.index("report.html written") < err.index("publishing ") < err.index("] done")
    manifest = json.loads((Path(scored.output_uri) / "manifest.json").read_text())
    assert manifest["metadata"][IDENTITY_KEY]["seeds"] == [0, 5]

    again = evaluate_once(first, _config(), evaluations, label="base model", progress=True)
    assert again.generated == 0 and again.output_uri == scored.output_uri and again.scores == scored.scores
    assert "reusing" in capsys.readouterr().err
    # The same bytes published elsewhere are the same model (the manifests differ in their created_at).
    assert content_digest(copy) == content_digest(first)
    assert evaluate_once(copy, _config(), evaluations, label="copy").generated == 0

    # Other settings are another evaluation: another address, sampled.
    other = evaluate_once(first, _config(seeds=[0]), evaluations, label="base model")
    assert other.generated == 2 and other.output_uri != scored.output_uri

    # Paired with a baseline, the artifact is another (its report pairs them), published beside the stored one;
    # its images and scores are the stored ones, copied, not sampled again.
    paired = evaluate_once(
        first, _config(), evaluations, label="challenger", baseline_uri=scored.output_uri, progress=True
    )
    assert paired.generated == 0 and paired.output_uri != scored.output_uri and paired.scores == scored.scores
    assert f"4 image(s) and their scores copied from {scored.output_uri}, not sampled again" in capsys.readouterr().err
    copied, stored = Path(paired.output_uri), Path(scored.output_uri)
    assert (copied / "images" / "p1_s5.png").read_bytes() == (stored / "images" / "p1_s5.png").read_bytes()
    paired_with = json.loads((copied / "metrics.json").read_text())["baseline"]
    assert paired_with["uri"] == scored.output_uri and paired_with["paired"]["2"]["jpeg_compressibility"]["delta"] == 0


def test_damaged_or_mismatched_stored_scores_are_refused_with_the_fix(models, tmp_path):
    first, _ = models
    evaluations = str(tmp_path / "evaluations")
    scored = Path(evaluate_once(first, _config(), evaluations, label="base model").output_uri)

    manifest_path = scored / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["metadata"][IDENTITY_KEY]["seeds"] = [0, 6]  # says it is of other seeds than its address
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(G2RPOError, match=r"are not of this model and settings \(they differ in seeds\); delete "):
        evaluate_once(first, _config(), evaluations, label="base model")

    manifest["metadata"][IDENTITY_KEY]["seeds"] = [0, 5]
    manifest_path.write_text(json.dumps(manifest))
    scores = scored / "scores.json"
    scores.write_text(scores.read_text().replace('"seed": 0', '"seed":  0', 1))  # same size, other bytes
    with pytest.raises(G2RPOError, match=r"do not match their manifest .*scores\.json.*; delete .* run again"):
        evaluate_once(first, _config(), evaluations, label="base model")


def test_a_model_without_a_manifest_has_no_content_identity_and_is_scored_each_time(tiny_flux_dir, tmp_path):
    assert content_digest(str(tiny_flux_dir)) is None
    evaluations = str(tmp_path / "evaluations")
    one = evaluate_once(str(tiny_flux_dir), _config(seeds=[0]), evaluations, label="folder")
    two = evaluate_once(str(tiny_flux_dir), _config(seeds=[0]), evaluations, label="folder")
    assert one.generated == two.generated == 2 and one.output_uri != two.output_uri


def test_a_prompt_set_is_its_content_not_the_path_it_was_read_from():
    from tests.registry.registry_helpers import make_scores

    champion = make_scores({"hps": 0.3}, prompt_set="/runs/first/test.jsonl")
    champion = champion.model_copy(update={"prompt_set_sha256": "a" * 64})
    moved = make_scores({"hps": 0.4}, prompt_set="/runs/second/test.jsonl").model_copy(
        update={"prompt_set_sha256": "a" * 64}
    )
    assert paired_differences(moved, champion, "hps") == pytest.approx([0.1] * len(champion.items))
    other = moved.model_copy(update={"prompt_set_sha256": "b" * 64})
    with pytest.raises(G2RPOError, match="same prompt set"):
        paired_differences(other, champion, "hps")
