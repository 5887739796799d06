"""The evaluation artifact: what one evaluation publishes, and reading it back.

Layout under the artifact's URI (published with :func:`g2rpo.artifacts.manifest.publish_dir`, the
manifest last, so a reader sees all of it or nothing)::

    scores.json            g2rpo.artifacts.scores.EvalScores: every (prompt, seed)'s score per metric
    metrics.json           per metric: mean, std (sample, ddof 1; 0 for one item) and n
    prompts.json           the prompt set's URI and sha256, the seeds, and each prompt_id's text
    images/p{i}_s{seed}.png  the decoded sample of prompt p{i} and seed, 8-bit RGB
    grid.png               every image (rows: prompts, columns: seeds), titled with its scores
    manifest.json          every file's size and sha256; metadata: model URIs and the config

:func:`load_evaluation` reads it back as a :class:`g2rpo.evaluation.sampling.EvalResult` (images
as stored, so 8-bit quantised), e.g. to draw a before | after grid of two evaluations with
:func:`g2rpo.evaluation.sampling.save_before_after_grid`.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from pydantic import ValidationError

from g2rpo.artifacts.manifest import fetch_to_cache
from g2rpo.artifacts.scores import EvalScores
from g2rpo.artifacts.storage import S3Settings, locate
from g2rpo.data import dedupe_prompts, read_prompt_file
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.sampling import EvalResult

__all__ = [
    "PromptSet",
    "read_prompt_set",
    "metric_summaries",
    "image_name",
    "write_evaluation_dir",
    "save_score_grid",
    "load_evaluation",
]


@dataclass(frozen=True)
class PromptSet:
    """The prompts of an evaluation: where they came from, that file's digest, the texts used."""

    uri: str
    sha256: str
    prompts: list[str]


def read_prompt_set(uri: str, num_prompts: int | None = None, settings: S3Settings | None = None) -> PromptSet:
    """The first ``num_prompts`` distinct prompts of the file at ``uri`` (path, file:// or s3://)."""
    with tempfile.TemporaryDirectory(prefix="g2rpo-eval-prompts-") as tmp:
        if uri.startswith("s3://"):
            store, key = locate(uri, settings)
            local = Path(tmp) / key
            store.get_file(key, local)
        else:
            local = Path(uri.removeprefix("file://")).expanduser()
        try:
            prompts, _ = dedupe_prompts(read_prompt_file(local))
        except G2RPOError as exc:
            raise G2RPOError(str(exc).replace(str(local), uri)) from None
        digest = hashlib.sha256(local.read_bytes()).hexdigest()
    return PromptSet(uri=uri, sha256=digest, prompts=prompts[:num_prompts] if num_prompts else prompts)


def metric_summaries(result: EvalResult) -> dict[str, dict[str, float | int]]:
    """``metric -> {mean, std, n}`` over every (prompt, seed); std is the sample one (ddof 1)."""
    out: dict[str, dict[str, float | int]] = {}
    for name, values in result.scores.items():
        flat = values.double().flatten()
        n = int(flat.numel())
        out[name] = {"mean": float(flat.mean()), "std": float(flat.std()) if n > 1 else 0.0, "n": n}
    return out


def image_name(prompt_index: int, seed: int) -> str:
    return f"images/p{prompt_index}_s{seed}.png"


def write_evaluation_dir(result: EvalResult, prompt_set: PromptSet, directory: str | Path) -> EvalScores:
    """Write the artifact's files (all but the manifest) for ``result`` into ``directory``."""
    root = Path(directory)
    (root / "images").mkdir(parents=True, exist_ok=True)
    scores = result.eval_scores(prompt_set=prompt_set.uri, prompt_set_sha256=prompt_set.sha256)
    (root / "scores.json").write_text(json.dumps(scores.model_dump(mode="json"), indent=1) + "\n")
    (root / "metrics.json").write_text(json.dumps(metric_summaries(result), indent=1, sort_keys=True) + "\n")
    prompts = {
        "prompt_set": prompt_set.uri,
        "prompt_set_sha256": prompt_set.sha256,
        "seeds": list(result.seeds),
        "prompts": [{"prompt_id": f"p{i}", "prompt": text} for i, text in enumerate(result.prompts)],
    }
    (root / "prompts.json").write_text(json.dumps(prompts, indent=1, ensure_ascii=False) + "\n")
    for p in range(len(result.prompts)):
        for s, seed in enumerate(result.seeds):
            _save_png(result.images[p, s], root / image_name(p, seed))
    save_score_grid(result, root / "grid.png")
    return scores


def _save_png(image: torch.Tensor, path: Path) -> None:
    """``[3, H, W]`` in [0, 1] → 8-bit RGB PNG (round to nearest)."""
    array = (image.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    Image.fromarray(array).save(path)


def save_score_grid(result: EvalResult, path: str | Path, title: str = "") -> Path:
    """A PNG grid: one row per prompt, one column per seed, each image titled with its scores."""
    import matplotlib  # heavy: only the grid needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = len(result.prompts), len(result.seeds)
    names = list(result.scores)
    fig, axes = plt.subplots(
        rows, cols, figsize=(1.9 * cols + 1.2, (1.7 + 0.15 * len(names)) * rows + 0.7), dpi=100, squeeze=False
    )
    for p in range(rows):
        for s in range(cols):
            ax = axes[p, s]
            ax.imshow(result.images[p, s].permute(1, 2, 0).float().numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            lines = [f"seed {result.seeds[s]}"] if p == 0 else []
            lines += [f"{name} {float(result.scores[name][p, s]):.3f}" for name in names]
            ax.set_title("\n".join(lines), fontsize=6)
        text = result.prompts[p]
        axes[p, 0].set_ylabel(text if len(text) <= 22 else text[:21] + "…", fontsize=6, rotation=0, ha="right")
    means = ", ".join(f"{name} mean {result.mean(name):.4f}" for name in names)
    fig.suptitle(f"{title + ': ' if title else ''}{means} (rows: prompts, columns: seeds)", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path


def load_evaluation(output_uri: str, settings: S3Settings | None = None, cache_dir: str | None = None) -> EvalResult:
    """The evaluation published at ``output_uri`` (every file checked against its manifest):
    its prompts, seeds, images ``[P, S, 3, H, W]`` (8-bit, as stored) and scores ``[P, S]`` per metric."""
    root = fetch_to_cache(output_uri, cache_dir=cache_dir, settings=settings)
    scores = _read_scores(root / "scores.json", output_uri)
    listed = _read_json(root / "prompts.json", output_uri)["prompts"]
    prompts = [entry["prompt"] for entry in listed]
    ids = {entry["prompt_id"]: i for i, entry in enumerate(listed)}
    metrics = scores.metric_names()
    table = {name: torch.full((len(prompts), len(scores.seeds)), math.nan) for name in metrics}
    column = {seed: s for s, seed in enumerate(scores.seeds)}
    for item in scores.items:
        if item.prompt_id not in ids:
            raise G2RPOError(
                problem(
                    "scores.json items.prompt_id",
                    item.prompt_id,
                    f"is not in {output_uri}/prompts.json: the artifact is inconsistent; evaluate again",
                )
            )
        for name, value in item.scores.items():
            table[name][ids[item.prompt_id], column[item.seed]] = value
    missing = [name for name, values in table.items() if torch.isnan(values).any()]
    if missing:
        raise G2RPOError(
            problem("scores.json", missing, f"{output_uri} lacks some (prompt, seed) scores: evaluate again")
        )
    images = torch.stack(
        [
            torch.stack([_load_png(root / image_name(p, seed), output_uri) for seed in scores.seeds])
            for p in range(len(prompts))
        ]
    )  # [P, S, 3, H, W]
    return EvalResult(prompts=prompts, seeds=list(scores.seeds), images=images, scores=table)


def _read_json(path: Path, uri: str) -> Any:
    if not path.is_file():
        raise G2RPOError(problem("output_uri", uri, f"has no {path.name}: it is not an evaluation artifact"))
    return json.loads(path.read_text(encoding="utf-8"))


def _read_scores(path: Path, uri: str) -> EvalScores:
    try:
        return EvalScores.model_validate(_read_json(path, uri))
    except ValidationError as exc:
        raise G2RPOError(f"{uri}/scores.json is not a valid score record: {exc.errors()[0]['msg']}") from None


def _load_png(path: Path, uri: str) -> torch.Tensor:
    if not path.is_file():
        raise G2RPOError(
            problem(
                "output_uri", uri, f"lacks {path.parent.name}/{path.name}: the artifact is incomplete; evaluate again"
            )
        )
    array = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0  # [H, W, 3]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
