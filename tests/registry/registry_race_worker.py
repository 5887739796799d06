"""Worker processes for the promotion race tests (a module so that `spawn` can import it)."""

from __future__ import annotations


def race_state_writes(root: str, me: int, models: list[str], barrier, results) -> None:
    """For each model: read its state, wait for the other process, then write champion=me+2.

    The barrier sits between the read and the conditional write, so both processes write against
    the same etag (or the same absence) at nearly the same instant.
    """
    from g2rpo.artifacts.registry import AliasConflict, HistoryEvent, Registry

    reg = Registry(root)
    version = me + 2
    for model in models:
        expected = reg.read_state(model)

        def change(state, version=version):
            return [
                HistoryEvent(
                    revision=0,
                    at="",
                    actor="",
                    action="promote",
                    alias="champion",
                    version=version,
                    previous=state.aliases.get("champion"),
                )
            ]

        barrier.wait(timeout=60)
        try:
            reg.update_state(model, change, expected=expected)
            results.put((model, me, "won"))
        except AliasConflict:
            results.put((model, me, "conflict"))
        except Exception as exc:  # reported, so the test shows it instead of hanging
            results.put((model, me, f"error: {type(exc).__name__}: {exc}"))


def race_promotions(root: str, me: int, jobs: list[tuple[str, int]], gates_json: str, barrier, results) -> None:
    """For each (model, version): wait for the other process, then run the whole gated promotion."""
    from g2rpo.artifacts.promotion import Gates, promote
    from g2rpo.artifacts.registry import AliasConflict, Registry

    reg = Registry(root)
    gates = Gates.model_validate_json(gates_json)
    for model, version in jobs:
        barrier.wait(timeout=60)
        try:
            decision = promote(reg, model, version, gates)
            results.put((model, me, "won" if decision.passed else "failed"))
        except AliasConflict:
            results.put((model, me, "conflict"))
        except Exception as exc:
            results.put((model, me, f"error: {type(exc).__name__}: {exc}"))
