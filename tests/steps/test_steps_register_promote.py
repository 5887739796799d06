"""Steps register and decide+promote on a file:// registry and on S3 (SeaweedFS): what is recorded,
what a refusal leaves behind (nothing), and the floor-gate policy of a first version."""

from __future__ import annotations

from pathlib import Path

import pytest
from steps_helpers import make_scores, publish_fake_export

from g2rpo.artifacts.promotion import load_gates
from g2rpo.artifacts.publish import publish_dir
from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import G2RPOError
from g2rpo.steps.promote import decide_and_promote, write_gates
from g2rpo.steps.register import read_scores, register
from tests.registry.registry_helpers import floor_gates

pytestmark = pytest.mark.integration

MODEL = "steps-model"


def _register(root, tmp_path, scores, run, **extra):
    return register(
        f"{root}/registry",
        MODEL,
        export_uri=publish_fake_export(root, tmp_path, run),
        scores=scores,
        source_run=run,
        config_hash="cfg-" + run,
        base_model="tiny",
        licence="apache-2.0",
        **extra,
    )


def test_register_records_the_export_and_the_scores(root_uri, tmp_path):
    scores = make_scores({"jpeg": -5.0}, offsets=[0.1 * k for k in range(8)])
    result = _register(root_uri, tmp_path, scores, "r1", challenger=True)
    registry = Registry(f"{root_uri}/registry")
    record = registry.get_version(MODEL, 1)
    assert result.version == 1 and result.record == record and result.registry_uri == registry.store.uri
    assert record.export.uri == result.record.export.uri and record.source_run == "r1"
    assert {f.path for f in result.export_manifest.files} == {
        "transformer/diffusion_pytorch_model.safetensors",
        "base_model.json",
    }
    assert registry.load_scores(record) == scores and result.scores_uri == record.eval.scores_uri
    assert result.means == {"jpeg": pytest.approx(-5.0 + 0.35)}
    state, _ = registry.read_state(MODEL)
    assert state.aliases == {"challenger": 1} and result.challenger


def test_register_refuses_an_unpublished_export_and_writes_nothing(root_uri, tmp_path):
    with pytest.raises(G2RPOError, match="has no manifest.json"):
        register(
            f"{root_uri}/registry",
            MODEL,
            export_uri=f"{root_uri}/exports/never",
            scores=make_scores({"jpeg": -5.0}),
            source_run="r",
            config_hash="h",
            base_model="tiny",
            licence="l",
        )
    assert open_store(f"{root_uri}/registry").list() == []


def test_read_scores_names_the_field_the_location_and_the_bad_item(tmp_path):
    good = tmp_path / "scores.json"
    good.write_text(make_scores({"jpeg": -5.0}).model_dump_json())
    assert read_scores(good.as_uri()) == read_scores(str(good)) == make_scores({"jpeg": -5.0})
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"jpeg":-5.0', '"jpeg":NaN', 1))
    with pytest.raises(G2RPOError, match=r"items\[0\]\.scores\.jpeg=nan: scores must be finite") as err:
        read_scores(str(bad), field="--scores")
    assert f"--scores='{bad}': not a valid scores file" in str(err.value)
    with pytest.raises(G2RPOError, match="scores='nope.json': no such file"):
        read_scores("nope.json")


def test_a_first_versions_floors_come_from_the_base_models_means():
    """What make demo gates a first version with (docs/demo.md): trained metrics must beat the base model by
    min_improvement, held-out ones may fall at most max_regression (the direction flips both)."""
    from g2rpo.artifacts.promotion import Gates, MetricGate
    from g2rpo.steps.promote import base_model_floors

    gates = Gates(
        metrics={
            "hps_v21": MetricGate(direction="higher", domain="in", min_improvement=0.005),
            "shapes_colour": MetricGate(direction="higher", domain="out", max_regression=0.05),
            "lpips": MetricGate(direction="lower", domain="out", max_regression=0.1),
            "unscored": MetricGate(direction="higher", domain="out", max_regression=0.05),
        }
    )
    floors = base_model_floors(gates, {"hps_v21": 0.4511, "shapes_colour": 0.7975, "lpips": 0.3})
    got = {name: gate.floor for name, gate in floors.metrics.items()}
    # 0.4511 + 0.005; 0.7975 − 0.05; lower is better: 0.3 + 0.1; not scored by the base model: no floor
    assert got == pytest.approx({"hps_v21": 0.4561, "shapes_colour": 0.7475, "lpips": 0.4, "unscored": None})
    assert floors.metrics["hps_v21"].min_improvement == 0.005  # the rest of each gate as it was


def test_the_demos_first_version_gates_file_carries_the_base_models_floors(tmp_path):
    """floor_gates_file: what `g2rpo pipeline run-local` gates a first version with, written from a gates file
    and the base model's means (configs/shapes-gates.yaml: hps_v21 in-domain +0.005, shapes_colour held out
    -0.05); a metric the base model was not scored on keeps no floor."""
    from g2rpo.steps.promote import floor_gates_file

    source = Path(__file__).resolve().parents[2] / "configs" / "shapes-gates.yaml"
    path = floor_gates_file(str(source), {"hps_v21": 0.4511, "shapes_colour": 0.7975}, tmp_path / "gates.yaml")
    loaded, _ = load_gates(path)
    assert loaded.metrics["hps_v21"].floor == pytest.approx(0.4511 + 0.005)
    assert loaded.metrics["shapes_colour"].floor == pytest.approx(0.7975 - 0.05)
    assert loaded.metrics["clip"].floor is None
    assert path.read_text().startswith(f"# {source} with floors for a first version (no champion)")


def test_floor_gates_round_trip_through_their_yaml(tmp_path):
    gates = floor_gates({"jpeg": -7.183922729980469, "clip": 0.25})
    path, sha = write_gates(gates, tmp_path / "gates.yaml", comment="a first version\nfloors: base model")
    loaded, loaded_sha = load_gates(path)
    assert loaded == gates and loaded_sha == sha
    assert loaded.metrics["jpeg"].floor == -7.183922729980469  # bit-exact: the floor is compared with >=
    assert path.read_text().startswith("# a first version\n# floors: base model\n")
    assert all(g.direction == "higher" and g.domain == "in" for g in loaded.metrics.values())


def test_promote_a_first_version_against_its_floor(root_uri, tmp_path):
    registry_uri = f"{root_uri}/registry"
    _register(root_uri, tmp_path, make_scores({"jpeg": -5.0}), "r1")
    above = floor_gates({"jpeg": -5.5})
    below = floor_gates({"jpeg": -4.5})
    # a dry run decides and records nothing
    dry = decide_and_promote(registry_uri, MODEL, 1, above, dry_run=True)
    assert dry.passed and dry.dry_run and dry.champion is None
    assert Registry(registry_uri).decisions(MODEL, 1) == []
    # a floor above the version's mean: refused, recorded, no champion
    refused = decide_and_promote(registry_uri, MODEL, "v1", below, gates_sha256="abc", reason="test")
    assert not refused.passed and refused.champion is None and refused.version == 1
    decisions = Registry(registry_uri).decisions(MODEL, 1)
    assert len(decisions) == 1 and decisions[0]["gates_sha256"] == "abc"
    # the floor met: champion
    promoted = decide_and_promote(registry_uri, MODEL, 1, above)
    assert promoted.passed and promoted.champion == 1
    assert Registry(registry_uri).read_state(MODEL)[0].aliases["champion"] == 1


def test_promote_a_challenger_against_the_champion(root_uri, tmp_path):
    registry_uri = f"{root_uri}/registry"
    _register(root_uri, tmp_path, make_scores({"jpeg": -5.0}), "r1")
    assert decide_and_promote(registry_uri, MODEL, 1, floor_gates({"jpeg": -6.0})).champion == 1
    offsets = [0.01 * k for k in range(8)]  # every item better than the champion's
    _register(root_uri, tmp_path, make_scores({"jpeg": -4.0}, offsets), "r2", challenger=True)
    result = decide_and_promote(registry_uri, MODEL, "challenger", floor_gates({"jpeg": -6.0}, 0.5))
    assert result.version == 2 and result.passed and result.champion == 2
    assert result.decision.champion == 1  # compared with the previous champion


def test_register_reads_the_scores_of_a_published_evaluation(root_uri, tmp_path):
    scores = make_scores({"jpeg": -5.0}, offsets=[0.1 * k for k in range(8)])
    folder = tmp_path / "evaluation"
    folder.mkdir()
    (folder / "scores.json").write_text(scores.model_dump_json())
    (folder / "metrics.json").write_text("{}")
    publish_dir(folder, f"{root_uri}/evaluations/e1", producer="test")
    result = _register(root_uri, tmp_path, None, "r1", eval_uri=f"{root_uri}/evaluations/e1")
    assert Registry(f"{root_uri}/registry").load_scores(result.record) == scores
    # an evaluation that was never published, or both sources at once: refused, nothing written
    with pytest.raises(G2RPOError, match="has no manifest.json"):
        _register(root_uri, tmp_path, None, "r2", eval_uri=f"{root_uri}/evaluations/never")
    with pytest.raises(G2RPOError, match="not both"):
        _register(root_uri, tmp_path, scores, "r3", eval_uri=f"{root_uri}/evaluations/e1")
    assert Registry(f"{root_uri}/registry").version_numbers(MODEL) == [1]
