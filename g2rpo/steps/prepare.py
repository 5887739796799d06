"""Step **prepare data**: a prompt file in, the train/test split and (with a model) their text-embedding caches out.

What ``g2rpo data prep`` runs: validate, dedupe and split the prompts (:func:`g2rpo.data.prepare_prompts`);
with ``model_uri``, encode both splits with the model's T5 and CLIP text encoders into sharded caches
(:func:`g2rpo.data.write_embedding_cache`). A missing or partial model is reported before anything is
written, so a failed run leaves no half-made output behind.

Output layout under ``output_uri`` (a local folder or ``file://`` URI): ``train.jsonl``, ``test.jsonl``,
``manifest.json``; with a model also ``embeddings/train/`` and ``embeddings/test/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from g2rpo.artifacts.storage import check_writable
from g2rpo.data import EmbeddingCache, prepare_prompts, read_prompt_split, write_embedding_cache
from g2rpo.errors import G2RPOError, problem
from g2rpo.models.loading import TEXT_COMPONENTS, check_model_dir, load_text_encoder, resolve_model_location

__all__ = ["EmbeddingCacheRef", "PrepareResult", "local_output", "prepare_data"]

SPLITS = ("train", "test")


@dataclass(frozen=True)
class EmbeddingCacheRef:
    """One finished text-embedding cache (a split's), as read back through :class:`g2rpo.data.EmbeddingCache`."""

    split: str
    path: Path
    manifest_path: Path  # written last: its presence means the cache is complete
    count: int  # prompts
    shards: int
    total_bytes: int  # every file but the manifest
    dtype: str
    shapes: dict[str, tuple[int, ...]]  # tensor name -> per-prompt shape


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare_data` wrote."""

    output_uri: str  # as given
    output_dir: Path
    source: str
    read: int  # prompts in the file
    duplicates: int  # dropped
    train: int
    test: int
    seed: int
    manifest_path: Path  # the split's manifest
    embeddings: dict[str, EmbeddingCacheRef]  # split -> cache; empty without a model, no entry for an empty split

    @property
    def train_prompts(self) -> Path:
        return self.output_dir / "train.jsonl"

    @property
    def test_prompts(self) -> Path:
        return self.output_dir / "test.jsonl"


def local_output(uri: str | Path, field: str = "output") -> Path:
    """The local folder of ``uri`` (a path or ``file://`` URI); ``s3://`` outputs are refused with the fix."""
    text = str(uri)
    if text.startswith("file://"):
        return Path(text.removeprefix("file://"))
    if "://" in text:
        raise G2RPOError(
            problem(field, text, "this step writes a local folder (a path or file:// URI); publish it afterwards")
        )
    return Path(text)


def prepare_data(
    prompts_uri: str,
    output_uri: str | Path,
    *,
    model_uri: str | None = None,
    test_size: int | float = 400,
    seed: int = 0,
    dtype: str = "bfloat16",
    device: str = "cpu",
    max_sequence_length: int | None = None,
    batch_size: int = 8,
    shard_rows: int = 256,
    overwrite: bool = False,
    progress: bool = False,
) -> PrepareResult:
    """Split ``prompts_uri`` (a path or ``s3://`` URI) into ``output_uri``; with ``model_uri`` also cache
    the text embeddings of both splits. Existing outputs are refused unless ``overwrite``."""
    out = local_output(output_uri)
    check_writable(out, "output")
    model = None
    if model_uri:  # checked before anything is written
        model = resolve_model_location(model_uri)
        check_model_dir(model, TEXT_COMPONENTS)
    summary = prepare_prompts(prompts_uri, out, test_size=test_size, seed=seed, overwrite=overwrite)
    caches: dict[str, EmbeddingCacheRef] = {}
    if model is not None:
        encoder = load_text_encoder(model, dtype=dtype, max_sequence_length=max_sequence_length)
        encoder.text_encoder.to(device)
        encoder.text_encoder_2.to(device)
        for split in SPLITS:
            prompts = read_prompt_split(out / f"{split}.jsonl") if (out / f"{split}.jsonl").stat().st_size else []
            if not prompts:
                continue
            path = out / "embeddings" / split
            write_embedding_cache(
                path,
                prompts,
                encoder,
                batch_size=batch_size,
                shard_rows=shard_rows,
                encoder_source=str(model_uri),
                overwrite=overwrite,
                progress=progress,
            )
            caches[split] = _cache_ref(split, path)
    return PrepareResult(
        output_uri=str(output_uri),
        output_dir=out,
        source=summary.source,
        read=summary.read,
        duplicates=summary.duplicates,
        train=summary.train,
        test=summary.test,
        seed=summary.seed,
        manifest_path=out / "manifest.json",
        embeddings=caches,
    )


def _cache_ref(split: str, path: Path) -> EmbeddingCacheRef:
    """Read a finished cache back (which checks it) and describe it."""
    cache = EmbeddingCache(path)
    first = cache[0]
    files = [p for p in path.iterdir() if p.is_file() and p.name != "manifest.json"]
    return EmbeddingCacheRef(
        split=split,
        path=path,
        manifest_path=path / "manifest.json",
        count=len(cache),
        shards=sum(1 for p in files if p.suffix == ".safetensors"),
        total_bytes=sum(p.stat().st_size for p in files),
        dtype=str(first.prompt_embeds.dtype).removeprefix("torch."),
        shapes={
            "prompt_embeds": tuple(first.prompt_embeds.shape[1:]),
            "pooled_prompt_embeds": tuple(first.pooled_prompt_embeds.shape[1:]),
        },
    )
