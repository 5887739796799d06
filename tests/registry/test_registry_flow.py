"""Registry flows on file:// and S3: register, gated promote, rollback, history, conflicts."""

from __future__ import annotations

import json

import pytest
from registry_helpers import make_scores, register_version

from g2rpo.artifacts.promotion import Gates, promote, rollback
from g2rpo.artifacts.registry import AliasConflict, HistoryEvent, Registry
from g2rpo.artifacts.storage import open_store
from g2rpo.errors import G2RPOError

pytestmark = pytest.mark.integration

GATES = Gates.model_validate(
    {
        "metrics": {
            "hps": {"direction": "higher", "domain": "in", "min_improvement": 0.01, "floor": 0.2},
            "clip": {"direction": "higher", "domain": "out", "max_regression": 0.01, "floor": 0.25},
        }
    }
)


def test_registry_register_records_everything(root_uri, tmp_path):
    reg = Registry(f"{root_uri}/registry")
    v = register_version(reg, "flux-g2rpo", root_uri, tmp_path, make_scores({"hps": 0.3, "clip": 0.3}))
    assert v == 1
    record = reg.get_version("flux-g2rpo", 1)
    assert record.source_run == "run-1" and record.config_hash == "cfg-run-1"
    assert record.base_model.licence == "flux-1-dev-non-commercial-license"
    assert {f.path for f in record.export.files} == {
        "base_model.json",
        "transformer/diffusion_pytorch_model.safetensors",
    }
    assert record.eval.n == 16 and record.eval.seeds == [0, 1] and record.eval.prompt_set == "test-prompts-v1"
    assert record.eval.metrics["hps"].mean == pytest.approx(0.3)
    assert reg.load_scores(record).keyed("clip")[("p3", 1)] == pytest.approx(0.3)
    assert reg.models() == ["flux-g2rpo"] and reg.version_numbers("flux-g2rpo") == [1]
    with pytest.raises(G2RPOError, match="no such version"):
        reg.get_version("flux-g2rpo", 9)
    with pytest.raises(G2RPOError, match="model='Bad Name'"):
        reg.read_state("Bad Name")


def test_registry_version_numbers_are_claimed_atomically(root_uri, tmp_path, monkeypatch):
    reg = Registry(f"{root_uri}/registry")
    register_version(reg, "m1", root_uri, tmp_path, make_scores({"hps": 0.3}), run="a")
    # A writer with a stale view (it believes there are no versions) must not overwrite v1.
    monkeypatch.setattr(reg, "version_numbers", lambda model: [])
    assert register_version(reg, "m1", root_uri, tmp_path, make_scores({"hps": 0.4}), run="b") == 2
    assert reg.get_version("m1", 1).source_run == "a"


def test_registry_promote_rollback_history(root_uri, tmp_path):
    reg = Registry(f"{root_uri}/registry")
    model = "flux-g2rpo"
    v1 = register_version(reg, model, root_uri, tmp_path, make_scores({"hps": 0.25, "clip": 0.30}), run="r1")
    v2 = register_version(reg, model, root_uri, tmp_path, make_scores({"hps": 0.30, "clip": 0.295}), run="r2")
    v3 = register_version(reg, model, root_uri, tmp_path, make_scores({"hps": 0.40, "clip": 0.20}), run="r3")

    first = promote(reg, model, v1, GATES)  # no champion: floors
    assert first.passed and first.champion is None
    assert reg.read_state(model)[0].aliases == {"champion": v1}

    reg.set_alias(model, "challenger", v2, reason="candidate")
    second = promote(reg, model, v2, GATES)  # +0.05 hps, −0.005 clip
    assert second.passed and second.champion == v1
    assert reg.read_state(model)[0].aliases == {"champion": v2}  # the challenger alias moved up
    third = promote(reg, model, v3, GATES)  # +0.10 hps but −0.095 clip: reward hacking, refused
    assert not third.passed
    state, _ = reg.read_state(model)
    assert state.aliases == {"champion": v2}
    # Every decision is stored with its version, the failed one included.
    stored = reg.decisions(model, v3)
    assert len(stored) == 1 and stored[0]["passed"] is False and stored[0]["champion"] == v2
    with pytest.raises(G2RPOError, match="already the champion"):
        promote(reg, model, v2, GATES)

    event = rollback(reg, model, reason="bad samples in prod")
    assert (event.previous, event.version) == (v2, v1)
    with pytest.raises(G2RPOError, match="no predecessor"):
        rollback(reg, model, reason="again")
    state, _ = reg.read_state(model)
    assert state.aliases == {"champion": v1} and state.revision == 4
    assert [(e.action, e.alias, e.previous, e.version) for e in state.history] == [
        ("promote", "champion", None, v1),
        ("set-alias", "challenger", None, v2),
        ("promote", "champion", v1, v2),
        ("clear-alias", "challenger", v2, None),
        ("rollback", "champion", v2, v1),
    ]
    # The promotion and the challenger's removal were one write: one revision.
    assert state.history[2].revision == state.history[3].revision == 3
    assert state.history[2].decision.startswith(f"models/{model}/decisions/{v2:06d}/")
    # The champion's artifacts are what GC must protect.
    champion = reg.get_version(model, v1)
    assert set(reg.protected_uris()) == {champion.export.uri, champion.eval.scores_uri}


def test_registry_stale_state_write_is_refused(root_uri, tmp_path):
    reg = Registry(f"{root_uri}/registry")
    register_version(reg, "m", root_uri, tmp_path, make_scores({"hps": 0.3}), run="a")
    register_version(reg, "m", root_uri, tmp_path, make_scores({"hps": 0.4}), run="b")
    stale = reg.read_state("m")  # nothing written yet: (empty state, no etag)

    def to(version):
        return lambda state: [
            HistoryEvent(
                revision=0,
                at="",
                actor="",
                action="set-alias",
                alias="champion",
                version=version,
                previous=state.aliases.get("champion"),
            )
        ]

    reg.update_state("m", to(1))
    with pytest.raises(AliasConflict, match="aliases and history were left as they are"):
        reg.update_state("m", to(2), expected=stale)  # create-only write of an existing state
    stale = reg.read_state("m")
    reg.update_state("m", to(2))
    with pytest.raises(AliasConflict):
        reg.update_state("m", to(1), expected=stale)  # If-Match with an old etag
    state, _ = reg.read_state("m")
    assert state.aliases == {"champion": 2} and [e.version for e in state.history] == [1, 2]


def test_registry_tampered_scores_are_refused(root_uri, tmp_path):
    reg = Registry(f"{root_uri}/registry")
    v = register_version(reg, "m", root_uri, tmp_path, make_scores({"hps": 0.3}))
    record = reg.get_version("m", v)
    store = open_store(record.eval.scores_uri)
    data = json.loads(store.get_bytes("scores.json")[0])
    data["items"][0]["scores"]["hps"] = 0.99
    store.put_bytes("scores.json", json.dumps(data).encode())
    with pytest.raises(G2RPOError, match="changed after registration"):
        reg.load_scores(record)


def test_registry_promotion_that_loses_the_race_says_so(root_uri, tmp_path, monkeypatch):
    reg = Registry(f"{root_uri}/registry")
    v1 = register_version(reg, "m", root_uri, tmp_path, make_scores({"hps": 0.25, "clip": 0.30}), run="a")
    v2 = register_version(reg, "m", root_uri, tmp_path, make_scores({"hps": 0.30, "clip": 0.30}), run="b")
    promote(reg, "m", v1, GATES)
    real_record = reg.record_decision

    def record_then_other_writer_rolls_back(model, version, decision):
        key = real_record(model, version, decision)
        # Another operator acts between this promotion's read of the state and its write.
        reg.set_alias("m", "challenger", v1, reason="someone else")
        return key

    monkeypatch.setattr(reg, "record_decision", record_then_other_writer_rolls_back)
    with pytest.raises(AliasConflict) as err:
        promote(reg, "m", v2, GATES)
    message = str(err.value)
    assert "aliases and history were left as they are" in message and "was not applied" in message
    state, _ = reg.read_state("m")
    # The other writer's change survives, and v2 did not become champion.
    assert state.aliases == {"champion": v1, "challenger": v1}
    assert [e.action for e in state.history] == ["promote", "set-alias"]
    (stored,) = reg.decisions("m", v2)
    assert stored["passed"] is True and f"models/m/decisions/{v2:06d}/" in message
