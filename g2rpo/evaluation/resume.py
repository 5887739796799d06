"""An evaluation's partial state: the chunks already sampled and scored, under the output prefix.

Until the artifact is published (its manifest written), an evaluation keeps what it has done under
``<output>/_partial/``, next to where the artifact will be, so that any process that can write the
output (another pod, another rank, a rerun after preemption) can continue it::

    _partial/state.json                      what is being evaluated (:class:`PartialState`)
    _partial/policy.json                     what the model loaded as (:class:`PolicyRecord`), for
                                             the manifest's metadata
    _partial/images/T{n}/p{i}_s{seed}.png    each image, as soon as its chunk is scored
    _partial/chunks/T{n}_c{k}.json           a chunk's record, written last: its items' scores and
                                             each image's sha256 (the chunk counts as done only then)

The (step count, prompt, seed) items of an evaluation are cut into fixed chunks (:func:`plan_chunks`)
that do not depend on what is done or on how many processes run, and a chunk is always sampled as
one batch, so a resumed evaluation computes every image exactly as an uninterrupted one would. A
rerun whose inputs differ from ``state.json`` is refused, naming each difference, and nothing is
deleted — unless no chunk was scored yet (say the model path was wrong): then there is nothing to
lose and the rerun starts afresh. After the publish, :func:`clear` removes the folder.

The output holds only what an evaluation writes (:func:`foreign_entries`): a folder with other
files — a user's ``notes.txt`` or own ``grid.png`` — is refused before anything is written there,
naming them, as the trainer refuses such an ``output.dir``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from dataclasses import dataclass

from pydantic import Field

from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME
from g2rpo.artifacts.scores import Record
from g2rpo.artifacts.storage import ObjectNotFound, Store
from g2rpo.errors import G2RPOError, problem
from g2rpo.faults import FAULT_ENV, announce, armed_fault
from g2rpo.textfile import JSON_MAX_BYTES, decode_record

__all__ = [
    "PARTIAL",
    "FAIL_POINT_ENV",
    "Chunk",
    "ChunkRecord",
    "ChunkItem",
    "PartialState",
    "PolicyRecord",
    "plan_chunks",
    "foreign_entries",
    "check_output",
    "open_state",
    "done_chunks",
    "read_chunk",
    "write_chunk",
    "read_policy",
    "write_policy",
    "clear",
    "fail_point",
]

PARTIAL = "_partial"
FAIL_POINT_ENV = FAULT_ENV  # the training fail points' variable; here ``eval_chunk:N``
# The top-level names an evaluation writes: its partial state, the artifact's layout
# (g2rpo.evaluation.artifact), the publish's claim and the manifest.
_EVALUATION_ENTRIES = frozenset(
    {
        PARTIAL,
        "scores.json",
        "scores.jsonl",
        "metrics.json",
        "prompts.json",
        "images",
        "grid.png",
        "grid",
        "plots",
        "baseline",
        "report.html",
        MARKER_NAME,
        MANIFEST_NAME,
    }
)


class PartialState(Record):
    """What a partial evaluation evaluates; a resume must match every field."""

    model_uri: str
    model_digest: str | None = Field(description="sha256 of the model's manifest.json, when it has one")
    prompt_set: str
    prompt_set_sha256: str
    prompts: list[str]
    seeds: list[int]
    step_counts: list[int]
    metrics: list[str]
    sampling: dict = Field(description="every config key that changes an image or a score")


class PolicyRecord(Record):
    """What the model at ``model_uri`` loaded as (g2rpo.evaluation.policy.Policy's kind and base)."""

    policy_kind: str
    base_model_uri: str


class ChunkItem(Record):
    steps: int
    prompt_index: int
    seed: int
    image: str  # key under _partial/
    image_sha256: str
    scores: dict[str, float]


class ChunkRecord(Record):
    chunk: str
    items: list[ChunkItem]


@dataclass(frozen=True)
class Chunk:
    """A fixed batch of items of one step count: ``(prompt_index, seed)`` in prompt-major order."""

    name: str
    steps: int
    items: tuple[tuple[int, int], ...]


def plan_chunks(step_counts: list[int], num_prompts: int, seeds: list[int], chunk_size: int) -> list[Chunk]:
    """Every item, cut into chunks of ``chunk_size`` per step count (the same cut on every run)."""
    chunks = []
    items = [(p, seed) for p in range(num_prompts) for seed in seeds]
    for steps in step_counts:
        for k, start in enumerate(range(0, len(items), chunk_size)):
            chunks.append(Chunk(f"T{steps}_c{k:05d}", steps, tuple(items[start : start + chunk_size])))
    return chunks


def foreign_entries(store: Store) -> list[str]:
    """The top-level names under ``store`` that are not an evaluation's (empty when it may write there).

    Only a started evaluation (its ``_partial/state.json`` or a publish's claim is there) owns the
    artifact's names: in any other folder a ``grid.png`` or ``report.html`` is the user's own.
    """
    names = sorted({info.key.split("/", 1)[0] for info in store.list("")})
    if not (store.exists(f"{PARTIAL}/state.json") or MARKER_NAME in names):
        return names
    return [name for name in names if name not in _EVALUATION_ENTRIES]


def check_output(store: Store, output_uri: str) -> None:
    """Refuse an output that holds files not of an evaluation, naming them, before anything is written."""
    foreign = foreign_entries(store)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise G2RPOError(
            problem(
                "output_uri",
                output_uri,
                f"holds files that are not an evaluation's ({shown}) and g2rpo never writes over or beside them: "
                f"choose a new or empty folder (e.g. {output_uri.rstrip('/')}/eval)",
            )
        )


def partial_image_key(steps: int, prompt_index: int, seed: int) -> str:
    return f"{PARTIAL}/images/T{steps}/p{prompt_index}_s{seed}.png"


def open_state(store: Store, state: PartialState, output_uri: str) -> bool:
    """Start (write ``state.json``) or continue (check it) the partial evaluation at ``store``.

    Returns whether there was one to continue. A differing one that has scored a chunk is refused,
    naming every field that differs, and nothing is removed; one that has scored nothing (it failed
    before its first chunk, e.g. on a wrong model path) is replaced, since nothing of it would be lost.
    """
    key = f"{PARTIAL}/state.json"
    if not store.exists(key):
        store.put_bytes(key, state.model_dump_json(indent=1).encode())
        return False
    fix = f"delete {store.uri_for(PARTIAL)} to drop what it has scored and evaluate afresh, or choose a new output"
    found = decode_record(PartialState, store.get_bytes(key, max_bytes=JSON_MAX_BYTES)[0], store.uri_for(key), fix=fix)
    differs = [name for name in PartialState.model_fields if getattr(found, name) != getattr(state, name)]
    if differs and not done_chunks(store):
        clear(store)  # a started chunk's images at most, none of them scored
        store.put_bytes(key, state.model_dump_json(indent=1).encode())
        return False
    if differs:
        details = "; ".join(
            f"{name}: partial {_brief(getattr(found, name))}, now {_brief(getattr(state, name))}" for name in differs
        )
        raise G2RPOError(
            problem(
                "output_uri",
                output_uri,
                f"holds a partial evaluation of other inputs ({details}); resume it with the same inputs, choose "
                f"a new output, or delete {store.uri_for(PARTIAL)} to drop what it has scored",
            )
        )
    return True


def _brief(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def done_chunks(store: Store) -> set[str]:
    """Names of the chunks whose record is written."""
    prefix = f"{PARTIAL}/chunks"
    return {info.key.removeprefix(prefix + "/").removesuffix(".json") for info in store.list(prefix)}


def read_chunk(store: Store, name: str) -> ChunkRecord:
    key = f"{PARTIAL}/chunks/{name}.json"
    fix = "delete it to have that chunk evaluated again (each chunk record is written whole, so it was changed since)"
    return decode_record(ChunkRecord, store.get_bytes(key, max_bytes=JSON_MAX_BYTES)[0], store.uri_for(key), fix=fix)


def write_chunk(store: Store, chunk: Chunk, pngs: list[bytes], scores: list[dict[str, float]]) -> ChunkRecord:
    """Save a chunk's images, then its record (last: a chunk without one is redone)."""
    items = []
    for (prompt_index, seed), png, item_scores in zip(chunk.items, pngs, scores, strict=True):
        key = partial_image_key(chunk.steps, prompt_index, seed)
        store.put_bytes(key, png)
        items.append(
            ChunkItem(
                steps=chunk.steps,
                prompt_index=prompt_index,
                seed=seed,
                image=key,
                image_sha256=hashlib.sha256(png).hexdigest(),
                scores=item_scores,
            )
        )
    record = ChunkRecord(chunk=chunk.name, items=items)
    store.put_bytes(f"{PARTIAL}/chunks/{chunk.name}.json", record.model_dump_json().encode())
    return record


def write_policy(store: Store, record: PolicyRecord) -> None:
    """Save what the model loaded as; every rank that samples writes the same record."""
    store.put_bytes(f"{PARTIAL}/policy.json", record.model_dump_json().encode())


def read_policy(store: Store) -> PolicyRecord:
    """The :class:`PolicyRecord` a sampling rank saved (this run's, or an earlier run's when every chunk was
    scored before)."""
    key = f"{PARTIAL}/policy.json"
    fix = f"delete {store.uri_for(PARTIAL)} to evaluate afresh (each rank writes the record whole, so it was changed since)"
    try:
        data = store.get_bytes(key, max_bytes=JSON_MAX_BYTES)[0]
    except ObjectNotFound:
        raise G2RPOError(f"{store.uri_for(key)} does not exist, though every chunk is scored: {fix}") from None
    return decode_record(PolicyRecord, data, store.uri_for(key), fix=fix)


def clear(store: Store) -> None:
    """Remove the partial state (after the artifact is published)."""
    store.delete_many([info.key for info in store.list(PARTIAL)])


def fail_point(chunks_written: int) -> None:
    """SIGKILL this process after its ``N``-th chunk record when ``G2RPO_FAULT_KILL_AT=eval_chunk:N``
    and ``G2RPO_ARM_FAULT_POINTS=1`` (the resume test's preemption, :mod:`g2rpo.faults`; unset, one
    dictionary lookup)."""
    wanted = armed_fault()
    if wanted == f"eval_chunk:{chunks_written}":
        announce(wanted, f"SIGKILL after chunk record {chunks_written}")
        os.kill(os.getpid(), signal.SIGKILL)
