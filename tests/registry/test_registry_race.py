"""Two processes race to move the champion alias, many times, on SeaweedFS and on file://.

Claim under test: with create-only (If-None-Match: *) and compare-and-swap (If-Match) writes of
the one state document, exactly one of two racing writers wins each round, the other gets
AliasConflict, and the stored aliases and history hold exactly the winner's event (no lost update).
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import registry_race_worker
from registry_helpers import make_scores, register_version

from g2rpo.artifacts.promotion import Gates
from g2rpo.artifacts.registry import HistoryEvent, Registry

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROUNDS = 60  # half create-races (no state yet), half update-races (state exists)


def _run_pair(target, args_for, expected_results: int):
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(me), barrier, results)) for me in (0, 1)]
    for p in procs:
        p.start()
    try:
        out = [results.get(timeout=180) for _ in range(expected_results)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    return out


def _seed_champion(reg: Registry, model: str) -> None:
    reg.update_state(
        model,
        lambda s: [
            HistoryEvent(revision=0, at="", actor="", action="promote", alias="champion", version=1, previous=None)
        ],
    )


def test_registry_racing_state_writes_one_winner(root_uri):
    reg = Registry(f"{root_uri}/registry")
    models = [f"race-{i:03d}" for i in range(ROUNDS)]
    for model in models[1::2]:
        _seed_champion(reg, model)  # odd rounds race an If-Match update, even rounds a create
    out = _run_pair(registry_race_worker.race_state_writes, lambda me: (reg.uri, me, models), 2 * ROUNDS)
    errors = [r for r in out if r[2].startswith("error")]
    assert not errors, errors[:3]
    for i, model in enumerate(models):
        outcome = {me: result for m, me, result in out if m == model}
        assert sorted(outcome.values()) == ["conflict", "won"], (model, outcome)
        winner = next(me for me, result in outcome.items() if result == "won")
        state, _ = reg.read_state(model)
        seeded = i % 2 == 1
        assert state.aliases == {"champion": winner + 2}
        assert state.revision == (2 if seeded else 1)
        assert [e.version for e in state.history] == ([1] if seeded else []) + [winner + 2]


def test_registry_racing_promotions_lose_no_update(root_uri, tmp_path):
    # Full gated promotions of v2 and v3 (both beat champion v1; v3 also beats v2) race each round.
    # Either one wins and the other gets a conflict, or (if one process read the state after the
    # other's write) both win in sequence; never may an event vanish or a promotion skip a champion.
    gates = Gates.model_validate({"metrics": {"hps": {"direction": "higher", "domain": "in", "min_improvement": 0.01}}})
    reg = Registry(f"{root_uri}/registry")
    rounds = 4
    models = [f"prom-{i}" for i in range(rounds)]
    for model in models:
        for hps in (0.30, 0.35, 0.40):
            register_version(reg, model, root_uri, tmp_path, make_scores({"hps": hps}), run=f"{model}-{hps}")
        _seed_champion(reg, model)
    out = _run_pair(
        registry_race_worker.race_promotions,
        lambda me: (reg.uri, me, [(m, 2 + me) for m in models], gates.model_dump_json()),
        2 * rounds,
    )
    assert not [r for r in out if r[2].startswith("error")], out
    for model in models:
        outcome = {me: result for m, me, result in out if m == model}
        state, _ = reg.read_state(model)
        promotions = [e for e in state.history if e.action == "promote"][1:]
        winners = [me + 2 for me, result in outcome.items() if result == "won"]
        assert sorted(e.version for e in promotions) == sorted(winners)
        # v2 fails its gate only when it runs against champion v3 (0.35 − 0.40 < 0.01).
        assert len(winners) >= 1
        if "failed" in outcome.values():
            assert outcome[1] == "won" and outcome[0] == "failed"
        # Each promotion's "previous" is the champion it was really compared against: a chain.
        chain = [1] + [e.version for e in promotions]
        assert [e.previous for e in promotions] == chain[:-1]
        assert state.aliases["champion"] == chain[-1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_registry_racing_state_writes_many_rounds(s3_env):
    """The same race, 1,000 rounds on SeaweedFS (opt-in: `make test-slow`)."""
    reg = Registry(f"{s3_env.uri}/registry")
    rounds = 1000
    models = [f"race-{i:04d}" for i in range(rounds)]
    for model in models[1::2]:
        _seed_champion(reg, model)
    out = _run_pair(registry_race_worker.race_state_writes, lambda me: (reg.uri, me, models), 2 * rounds)
    assert not [r for r in out if r[2].startswith("error")]
    winners = {}
    for model, me, result in out:
        if result == "won":
            assert model not in winners, f"two winners in {model}"
            winners[model] = me
    assert sorted(winners) == models
