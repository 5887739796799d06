"""Prompt sets and the text-embedding cache.

**Prompt sets.** A prompt file is plain text (one prompt per line) or JSONL (one object per line
with a string field ``prompt``; ``.jsonl`` suffix). Each prompt is stripped of surrounding
whitespace. An empty line, a line that is not UTF-8, or a JSONL line without a string ``prompt`` is
an error naming the line number and the fix; every bad line is listed at once (nothing is silently
skipped). Exact duplicates are dropped (first occurrence kept) and counted. The split into train and
test is deterministic and independent of the file's order: a prompt goes to test when its key
``sha256(f"{seed}\\x00{prompt}")`` is among the ``n_test`` smallest; both splits keep the file's
order. :func:`prepare_prompts` writes ``train.jsonl`` and ``test.jsonl`` (``{"index", "prompt"}``
per line) and then ``manifest.json``, last (the artifact manifest of :mod:`g2rpo.artifacts.manifest`:
sha256 and size of both files; the counts in its metadata).

**Text-embedding cache.** Flux's text conditioning is the T5-XXL sequence embedding ``[S, 4096]``
plus CLIP-L's pooled embedding ``[768]``. Computing them once per prompt set means training holds
only the transformer (and the VAE) on the accelerator. The price is disk: at S = 512 in bf16 one
prompt is 512 · 4096 · 2 B = 4 MiB (+1.5 KiB pooled), so the 103.7k HPSv2 training prompts take
~405 GiB. The cache is therefore

- **sharded**: ``shard-00000.safetensors``, ... with ``shard_rows`` prompts each (default 256 ≈
  1 GiB at Flux scale), tensors ``prompt_embeds [n, S, D]`` and ``pooled_prompt_embeds [n, P]``;
- **memory-mapped and read lazily**: safetensors' ``safe_open`` maps a shard and a row slice reads
  only that row's bytes, so a rank touches just the prompts it is given;
- **indexed**: ``index.json`` maps each prompt's global index to ``(prompt, shard, row)``;
- **manifested**: ``manifest.json`` is the manifest every g2rpo artifact carries
  (:mod:`g2rpo.artifacts.manifest`: schema version, producer, sha256 and size of every file),
  written last; the cache's own facts (count, shards, dtype, shapes, encoder source and
  ``max_sequence_length``) are its ``metadata``. A directory without it is an unfinished cache and
  is refused; opening checks every file's presence and size and ``index.json``'s sha256 (and, with
  ``verify=True``, every shard's sha256 — a full read). A cache whose files do not match is refused
  with the file named and the fix: rebuild it with ``g2rpo data prep --model ... --overwrite``.

The embeddings are stored in the text encoders' dtype and read back bit-exactly.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from g2rpo import __version__
from g2rpo.artifacts.manifest import MANIFEST_NAME, Manifest, mismatches, read_manifest, write_dir_manifest
from g2rpo.artifacts.ownership import check_replaceable
from g2rpo.artifacts.storage import FileStore, locate, sha256_file
from g2rpo.errors import G2RPOError, problem
from g2rpo.models.flux import FluxConditioning
from g2rpo.progress import progress_bar
from g2rpo.seeding import split_key
from g2rpo.textfile import decode_text, describe_kind, read_json_file

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from g2rpo.models.flux import FluxTextEncoder

__all__ = [
    "CACHE_KIND",
    "CACHE_SCHEMA_VERSION",
    "EmbeddingCache",
    "PrepSummary",
    "PromptEmbeddingDataset",
    "dedupe_prompts",
    "prepare_prompts",
    "read_prompt_file",
    "read_prompt_location",
    "read_prompt_split",
    "split_prompts",
    "write_embedding_cache",
]

# The cache's layout (shards + index.json, the metadata keys); 2 since the manifest is the artifacts' one.
CACHE_SCHEMA_VERSION = 2
CACHE_KIND = "flux-text-embeddings"
PROMPTS_KIND = "prompt-split"
MANIFEST = MANIFEST_NAME
INDEX = "index.json"
_MAX_LISTED_PROBLEMS = 20
_REBUILD = "rebuild it with `g2rpo data prep --model ... --overwrite`"


# --------------------------------------------------------------------------- files


def _write_json(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# --------------------------------------------------------------------------- prompt files


def read_prompt_location(location: str | Path) -> list[str]:
    """:func:`read_prompt_file` for a local path, ``file://`` URI or ``s3://bucket/key`` object.

    An S3 object is downloaded (storage layer: standard AWS credential chain and endpoint) into a
    temporary directory that is removed afterwards; error messages name the URI and line numbers.
    """
    text = str(location)
    if not text.startswith("s3://"):
        return read_prompt_file(text[len("file://") :] if text.startswith("file://") else text)

    store, key = locate(text)
    with tempfile.TemporaryDirectory(prefix="g2rpo-prompts-") as tmp:
        local = Path(tmp) / key
        store.get_file(key, local)
        try:
            return read_prompt_file(local)
        except G2RPOError as exc:
            raise G2RPOError(str(exc).replace(str(local), text)) from None


def read_prompt_file(path: str | Path) -> list[str]:
    """The prompts of a ``.txt`` (one per line) or ``.jsonl`` (field ``prompt``) file, stripped.

    Raises a :class:`G2RPOError` listing every empty, non-UTF-8 or malformed line by number.
    """

    src = Path(path)
    try:
        mode = os.stat(src).st_mode
    except FileNotFoundError:
        mode = None
    if mode is None:
        raise G2RPOError(
            problem("prompts", str(src), "file not found; pass a .txt (one prompt per line) or .jsonl file")
        )
    if not stat.S_ISREG(mode):  # checked before opening: a FIFO would block the read
        raise G2RPOError(
            problem("prompts", str(src), f"is {describe_kind(mode)}, not a prompt file; pass the .txt or .jsonl file")
        )
    raw = src.read_bytes()
    if b"\0" in raw or raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        decode_text(raw, f"prompt file {str(src)!r}")  # raises: UTF-16 or binary, with the line named
    if raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark is UTF-8, not content
        raw = raw[3:]
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the file's final newline ends the last line; it does not start an empty one
    is_jsonl = src.suffix.lower() == ".jsonl"
    prompts: list[str] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        line = line.removesuffix(b"\r")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(
                f"{src}:{number}: not UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1}); "
                "re-save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
            )
            continue
        if is_jsonl:
            if not text.strip():
                problems.append(
                    f"{src}:{number}: empty line; remove it (every line must be a JSON object with a 'prompt')"
                )
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                problems.append(f"{src}:{number}: not valid JSON ({exc.msg}); write one JSON object per line")
                continue
            if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
                problems.append(f'{src}:{number}: no string field \'prompt\'; write {{"prompt": "..."}}')
                continue
            text = record["prompt"]
        text = text.strip()
        if not text:
            problems.append(f"{src}:{number}: empty prompt; remove the line or write a prompt on it")
            continue
        prompts.append(text)
    if problems:
        shown = problems[:_MAX_LISTED_PROBLEMS]
        more = len(problems) - len(shown)
        lines_out = [f"prompt file {str(src)!r} has {len(problems)} bad line(s):"] + [f"  - {p}" for p in shown]
        if more:
            lines_out.append(f"  ... and {more} more")
        raise G2RPOError("\n".join(lines_out))
    if not prompts:
        raise G2RPOError(problem("prompts", str(src), "the file holds no prompts; write one prompt per line"))
    return prompts


def dedupe_prompts(prompts: Iterable[str]) -> tuple[list[str], int]:
    """Drop exact duplicates, keeping first occurrences in order; return (unique, number dropped)."""
    seen: dict[str, None] = {}
    total = 0
    for p in prompts:
        total += 1
        seen.setdefault(p, None)
    return list(seen), total - len(seen)


def split_prompts(prompts: Sequence[str], test_size: int | float, seed: int = 0) -> tuple[list[str], list[str]]:
    """Deterministic ``(train, test)`` split of unique prompts.

    ``test_size``: a count (int ≥ 0) or a fraction in (0, 1) (rounded to the nearest count). The
    test prompts are those with the smallest ``sha256(seed, prompt)`` keys, so the split does not
    depend on the file's order; each split keeps the input order.
    """
    n = len(prompts)
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)):
        raise G2RPOError(problem("test_size", test_size, "give a count (e.g. 400) or a fraction in (0, 1)"))
    if isinstance(test_size, float) and not test_size.is_integer():
        if not 0 < test_size < 1:
            raise G2RPOError(problem("test_size", test_size, "a fraction must lie in (0, 1)"))
        n_test = round(test_size * n)
    else:
        n_test = int(test_size)
    if not 0 <= n_test < n:
        raise G2RPOError(
            problem("test_size", test_size, f"leaves no training prompts out of {n}; use fewer than {n} test prompts")
        )
    order = sorted(range(n), key=lambda i: split_key(seed, prompts[i]))
    test_ids = set(order[:n_test])
    train = [p for i, p in enumerate(prompts) if i not in test_ids]
    test = [p for i, p in enumerate(prompts) if i in test_ids]
    return train, test


@dataclass(frozen=True)
class PrepSummary:
    """What :func:`prepare_prompts` did."""

    source: str
    read: int
    duplicates: int
    train: int
    test: int
    seed: int
    output: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _write_jsonl(path: Path, prompts: Sequence[str]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for i, p in enumerate(prompts):
            fh.write(json.dumps({"index": i, "prompt": p}, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def prepare_prompts(
    source: str | Path,
    output: str | Path,
    *,
    test_size: int | float = 400,
    seed: int = 0,
    overwrite: bool = False,
) -> PrepSummary:
    """Read, validate, dedupe and split ``source`` (path or ``s3://`` URI); write ``train.jsonl``,
    ``test.jsonl`` and, last, ``manifest.json`` into the local directory ``output``.

    Refuses to replace existing outputs unless ``overwrite``; then the old manifest is removed
    first, so an interrupted rewrite is never taken for a finished one.
    """
    out = Path(output)
    names = ("train.jsonl", "test.jsonl", MANIFEST)
    existing = [n for n in names if (out / n).exists()]
    if existing and not overwrite:
        raise G2RPOError(
            problem(
                "output", str(out), f"already holds {', '.join(existing)}; choose another directory or pass --overwrite"
            )
        )
    if existing:
        _check_prompt_split_overwrite(out, existing)
    prompts = read_prompt_location(source)
    unique, duplicates = dedupe_prompts(prompts)
    train, test = split_prompts(unique, test_size, seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    _write_jsonl(out / "train.jsonl", train)
    _write_jsonl(out / "test.jsonl", test)
    summary = PrepSummary(str(source), len(prompts), duplicates, len(train), len(test), seed, str(out))
    write_dir_manifest(
        out,
        producer=f"g2rpo.data.prepare_prompts {__version__}",
        metadata={"kind": PROMPTS_KIND, "summary": summary.as_dict()},
        names=names[:2],
    )
    return summary


def _check_prompt_split_overwrite(out: Path, existing: list[str]) -> None:
    """--overwrite replaces train.jsonl/test.jsonl only under a manifest of a g2rpo prompt split: files of
    those names without it may be a user's own (the rule of g2rpo.artifacts.ownership)."""
    why = None
    try:
        manifest = read_manifest(FileStore(out))
        if not manifest.producer.startswith("g2rpo.data.") or manifest.metadata.get("kind") != PROMPTS_KIND:
            why = f"its {MANIFEST} was written by {manifest.producer!r} (kind {manifest.metadata.get('kind')!r})"
    except G2RPOError:
        why = f"it has no readable {MANIFEST} of a g2rpo prompt split"
    if why is not None:
        raise G2RPOError(
            problem(
                "output",
                str(out),
                f"holds {', '.join(existing)}, but {why}: --overwrite replaces only a prompt split g2rpo wrote; "
                "choose another directory, or move those files away yourself",
            )
        )


def read_prompt_split(path: str | Path) -> list[str]:
    """Prompts of a ``train.jsonl``/``test.jsonl`` written by :func:`prepare_prompts`, in index order."""
    src = Path(path)
    if not src.is_file():
        raise G2RPOError(
            problem("prompts", str(src), "file not found; run `g2rpo data prep` to make train.jsonl/test.jsonl")
        )
    prompts = read_prompt_file(src) if src.suffix.lower() == ".jsonl" else None
    if prompts is None:
        raise G2RPOError(problem("prompts", str(src), "expected a .jsonl file written by `g2rpo data prep`"))
    return prompts


# --------------------------------------------------------------------------- embedding cache


def _shard_name(number: int) -> str:
    return f"shard-{number:05d}.safetensors"


def write_embedding_cache(
    output: str | Path,
    prompts: Sequence[str],
    encoder: FluxTextEncoder,
    *,
    batch_size: int = 8,
    shard_rows: int = 256,
    encoder_source: str | None = None,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Encode ``prompts`` with ``encoder`` and write the sharded cache to ``output``, manifest last.

    Prompt ``i`` (its global index) lands in shard ``i // shard_rows``, row ``i % shard_rows``.
    ``encoder_source`` (the model location) is recorded in the manifest. Returns the manifest's
    metadata (``count``, ``shards``, ``shard_rows``, ``shapes``, ``dtype``, ``encoder``) plus
    ``total_bytes``, the size of every file of the cache.
    """
    from safetensors.torch import save_file

    if batch_size < 1:
        raise G2RPOError(problem("batch_size", batch_size, "encode at least one prompt per batch"))
    if shard_rows < 1:
        raise G2RPOError(problem("shard_rows", shard_rows, "put at least one prompt in a shard"))
    if not prompts:
        raise G2RPOError(problem("prompts", [], "nothing to encode; pass at least one prompt"))
    unique, dup = dedupe_prompts(prompts)
    if dup:
        raise G2RPOError(
            problem("prompts", f"{dup} duplicate(s)", "dedupe the prompt set first (g2rpo data prep does)")
        )
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise G2RPOError(problem("output", str(out), "is a file; pass a directory"))
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise G2RPOError(problem("output", str(out), "directory is not empty; choose another or pass --overwrite"))

        # Only a folder of cache files is replaced (a killed build's, without a manifest, included).
        check_replaceable(
            out, field="output", kind="text-embedding cache", own=("shard-*.safetensors", INDEX, MANIFEST)
        )
        # The manifest goes first: from here on the old cache counts as unfinished.
        (out / MANIFEST).unlink(missing_ok=True)
        for old in list(out.glob("shard-*.safetensors")) + [out / INDEX]:
            old.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)

    bar = None
    if progress:
        bar = progress_bar(total=len(prompts), desc="text embeddings", unit="prompt")
    shards: list[str] = []
    entries: list[list[Any]] = []
    pending: list[FluxConditioning] = []
    pending_rows = 0
    shapes: dict[str, list[int]] = {}
    dtype_name = ""

    def flush(rows: int) -> None:
        nonlocal pending, pending_rows
        cond = FluxConditioning.cat(pending)
        take, rest = cond[:rows], cond[rows:]
        number = len(shards)
        name = _shard_name(number)
        first = number * shard_rows
        save_file(
            {
                "prompt_embeds": take.prompt_embeds.contiguous().cpu(),
                "pooled_prompt_embeds": take.pooled_prompt_embeds.contiguous().cpu(),
            },
            str(out / name),
            metadata={"first_index": str(first), "rows": str(rows)},
        )
        shards.append(name)
        pending = [rest] if len(rest) else []
        pending_rows = len(rest)

    for start in range(0, len(prompts), batch_size):
        batch = list(prompts[start : start + batch_size])
        cond = encoder.encode(batch)
        if not shapes:
            shapes = {
                "prompt_embeds": list(cond.prompt_embeds.shape[1:]),
                "pooled_prompt_embeds": list(cond.pooled_prompt_embeds.shape[1:]),
            }
            dtype_name = str(cond.prompt_embeds.dtype).removeprefix("torch.")
        for offset, prompt in enumerate(batch):
            i = start + offset
            entries.append([prompt, i // shard_rows, i % shard_rows])
        pending.append(cond)
        pending_rows += len(batch)
        while pending_rows >= shard_rows:
            flush(shard_rows)
        if bar is not None:
            bar.update(len(batch))
    if pending_rows:
        flush(pending_rows)
    if bar is not None:
        bar.close()

    _write_json(out / INDEX, {"shard_rows": shard_rows, "entries": entries})
    metadata = {
        "kind": CACHE_KIND,
        "cache_version": CACHE_SCHEMA_VERSION,
        "count": len(prompts),
        "shard_rows": shard_rows,
        "shards": shards,
        "shapes": shapes,
        "dtype": dtype_name,
        "encoder": {"source": encoder_source, "max_sequence_length": encoder.max_sequence_length},
    }
    # last: the cache is complete from here on
    manifest = write_dir_manifest(
        out, producer=f"g2rpo.data.write_embedding_cache {__version__}", metadata=metadata, names=[*shards, INDEX]
    )
    return {**metadata, "total_bytes": manifest.total_size}


class EmbeddingCache:
    """A finished text-embedding cache, read lazily by global prompt index.

    ``cache[i]`` is the :class:`~g2rpo.models.flux.FluxConditioning` of prompt ``i`` (batch 1);
    ``cache.get(indices)`` a batch. ``cache.prompts[i]`` is its text. Shards are memory-mapped
    on first use; nothing else is read until asked for. Safe to pickle (handles are reopened).
    """

    def __init__(self, path: str | Path, *, verify: bool = False) -> None:
        self.path = Path(path)
        self.manifest: Manifest = self._check(verify)
        self.metadata: dict[str, Any] = dict(self.manifest.metadata)
        entries = self._entries()
        if len(entries) != self.metadata["count"]:
            raise G2RPOError(
                f"embedding cache {str(self.path)!r}: {INDEX} lists {len(entries)} prompts, the manifest "
                f"{self.metadata['count']}; {_REBUILD}"
            )
        self.prompts: list[str] = [e[0] for e in entries]
        self._where: list[tuple[int, int]] = [(int(e[1]), int(e[2])) for e in entries]
        self._position = {p: i for i, p in enumerate(self.prompts)}
        self._handles: dict[int, Any] = {}

    def _entries(self) -> list[list]:
        """The index's ``[prompt, shard, row]`` entries (its digest was checked against the manifest)."""
        path = self.path / INDEX
        index = read_json_file(path, what="embedding cache index", fix=_REBUILD)
        entries = index.get("entries")
        if not isinstance(entries, list):
            raise G2RPOError(f"embedding cache index {str(path)!r} has no 'entries' list; {_REBUILD}")
        for number, entry in enumerate(entries):
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and isinstance(entry[0], str)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry[1:])
            ):
                raise G2RPOError(
                    f"embedding cache index {str(path)!r}: entries[{number}] is {json.dumps(entry)[:80]}, not "
                    f"[prompt, shard, row]; {_REBUILD}"
                )
        return entries

    def _check(self, verify: bool) -> Manifest:
        """The cache's manifest, once its files match it (sizes; every sha256 when ``verify``)."""
        root = self.path
        where = f"embedding cache {str(root)!r}"
        if not root.is_dir():
            raise G2RPOError(
                problem(
                    "embeddings", str(root), "no such directory; build the cache with `g2rpo data prep --model ...`"
                )
            )
        if not (root / MANIFEST).is_file():
            found = sorted(p.name for p in root.iterdir())
            what = f"it holds {', '.join(found[:5])}{' ...' if len(found) > 5 else ''}" if found else "it is empty"
            raise G2RPOError(f"{where} is incomplete: no {MANIFEST} ({what}); the writer did not finish — {_REBUILD}")
        store = FileStore(root)
        try:
            manifest = read_manifest(store)
        except G2RPOError as exc:  # e.g. the format of g2rpo before the shared manifest
            raise G2RPOError(f"{where} has no readable manifest ({exc}); {_REBUILD}") from None
        meta = manifest.metadata
        if meta.get("kind") != CACHE_KIND or meta.get("cache_version") != CACHE_SCHEMA_VERSION:
            raise G2RPOError(
                problem(
                    f"{root / MANIFEST}:metadata",
                    {"kind": meta.get("kind"), "cache_version": meta.get("cache_version")},
                    f"this g2rpo reads {CACHE_KIND} caches of version {CACHE_SCHEMA_VERSION}; {_REBUILD}",
                )
            )
        listed = {entry.path: entry for entry in manifest.files}
        unlisted = [name for name in [*meta.get("shards", []), INDEX] if name not in listed]
        problems = [f"{name}: part of the cache but not in the manifest's files" for name in unlisted]
        if not problems:
            problems = mismatches(store, manifest, deep=verify)
        if not problems and not verify:  # index.json is read in full anyway: its digest is always checked
            digest, expected = sha256_file(root / INDEX)[1], listed[INDEX].sha256
            if digest != expected:
                problems = [f"{INDEX}: sha256 {digest[:12]}…, manifest says {expected[:12]}…"]
        if problems:
            raise G2RPOError(
                f"{where} does not match its manifest ({len(problems)} problem(s)); {_REBUILD}:\n"
                + "\n".join(f"  - {p}" for p in problems)
            )
        return manifest

    def __len__(self) -> int:
        return len(self.prompts)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state

    @property
    def max_sequence_length(self) -> int:
        return int(self.metadata["shapes"]["prompt_embeds"][0])

    def index_of(self, prompt: str) -> int:
        """Global index of ``prompt`` (a KeyError-free lookup: unknown prompts are a G2RPOError)."""
        try:
            return self._position[prompt]
        except KeyError:
            raise G2RPOError(
                problem(
                    "prompt", prompt, f"not in the embedding cache {str(self.path)!r}; re-run `g2rpo data prep` with it"
                )
            ) from None

    def _shard(self, number: int) -> Any:
        handle = self._handles.get(number)
        if handle is None:
            from safetensors import safe_open

            handle = safe_open(str(self.path / _shard_name(number)), framework="pt", device="cpu")
            self._handles[number] = handle
        return handle

    def __getitem__(self, index: int) -> FluxConditioning:
        return self.get([index])

    def get(self, indices: Sequence[int] | torch.Tensor) -> FluxConditioning:
        """Conditioning of prompts ``indices`` (global indices, repeats allowed), in that order."""
        import torch

        idx = [int(i) for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices)]
        if not idx:
            raise G2RPOError(problem("indices", idx, "ask for at least one prompt"))
        seq, pooled = [], []
        for i in idx:
            if not 0 <= i < len(self.prompts):
                raise G2RPOError(problem("index", i, f"the cache holds prompts 0..{len(self.prompts) - 1}"))
            shard, row = self._where[i]
            handle = self._shard(shard)
            seq.append(handle.get_slice("prompt_embeds")[row : row + 1])  # [1, S, D]
            pooled.append(handle.get_slice("pooled_prompt_embeds")[row : row + 1])  # [1, P]
        return FluxConditioning(torch.cat(seq), torch.cat(pooled))


@dataclass(frozen=True)
class PromptItem:
    """One prompt of a data set: its global index, its text and its conditioning (batch 1)."""

    index: int
    prompt: str
    cond: FluxConditioning


class PromptEmbeddingDataset:
    """A map-style dataset over an :class:`EmbeddingCache`, by global prompt index.

    The trainer decides which global indices a rank takes (one prompt = one group stays on one
    rank) and reads them with ``dataset[i]`` or, batched, ``dataset.batch(indices)``.
    Works with ``torch.utils.data.DataLoader`` (use :meth:`collate`).
    """

    def __init__(self, cache: EmbeddingCache | str | Path) -> None:
        self.cache = cache if isinstance(cache, EmbeddingCache) else EmbeddingCache(cache)

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int) -> PromptItem:
        return PromptItem(int(index), self.cache.prompts[int(index)], self.cache[int(index)])

    def batch(self, indices: Sequence[int]) -> tuple[list[str], FluxConditioning]:
        """``(prompts, cond)`` of global ``indices``, in order."""
        return [self.cache.prompts[int(i)] for i in indices], self.cache.get(indices)

    @staticmethod
    def collate(items: Sequence[PromptItem]) -> tuple[list[int], list[str], FluxConditioning]:
        return [it.index for it in items], [it.prompt for it in items], FluxConditioning.cat([it.cond for it in items])
