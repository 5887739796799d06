"""Registry records changed outside g2rpo (cut short, NUL bytes, not an object) are refused naming the
record, what is wrong and the fix — never a JSONDecodeError — and nothing is written (docs/errors.md)."""

from __future__ import annotations

import pytest

from g2rpo.artifacts.registry import Registry
from g2rpo.errors import G2RPOError


def test_a_damaged_state_or_decision_is_named_with_the_fix(tmp_path):
    registry = Registry(str(tmp_path / "registry"))
    state_key = registry._state_key("flux-shapes")
    registry.store.put_bytes(state_key, b'{"model": "flux-shapes", "alia')
    with pytest.raises(
        G2RPOError, match=r"state\.json: line 1, column \d+: not valid JSON .*ends early.*restore it from a backup"
    ):
        registry.read_state("flux-shapes")
    registry.store.put_bytes(state_key, b'["flux-shapes"]')
    with pytest.raises(G2RPOError, match=r"state\.json holds an array where an object belongs: the registry record"):
        registry.read_state("flux-shapes")
    assert registry.store.get_bytes(state_key)[0] == b'["flux-shapes"]'  # nothing written over it
    decision = "models/flux-shapes/decisions/000001/20260101T000000-abcd.json"
    registry.store.put_bytes(decision, b'{"decision": "promote"}\0\0\0')
    with pytest.raises(G2RPOError, match=r"abcd\.json: line 1, column 24 holds a NUL byte.*restore it from a backup"):
        registry.decisions("flux-shapes", 1)
