"""The evaluation artifact: what one evaluation publishes, and reading it back.

Layout under the artifact's URI (published with :func:`g2rpo.artifacts.publish.publish_dir`, the
manifest last, so a reader sees all of it or nothing)::

    scores.json            g2rpo.artifacts.scores.EvalScores at num_steps: every (prompt, seed)'s score per
                           metric (what the registry and the promotion gates read), and per metric the
                           official definition it follows (the reward registry's ``definition``)
    scores.jsonl           every image of every step count: steps, prompt_id, prompt, seed, image, scores
    metrics.json           per step count and metric: mean, std (ddof 1), n, 95 % bootstrap CI; each
                           metric's definition; with a baseline, the paired differences and their CIs
                           (g2rpo.evaluation.report)
    prompts.json           the prompt set's URI and sha256, the seeds, and each prompt_id's text
    images/p{i}_s{seed}.png        the decoded sample of prompt p{i} and seed at num_steps, 8-bit RGB
    images/T{n}/p{i}_s{seed}.png   the same at each extra step count n
    grid/page-001.png ...  the num_steps images in pages of GRID_PAGE_PROMPTS prompts (rows) by at most
                           GRID_SEEDS_MAX seeds (columns), each image titled with its scores
    grid/index.json        which page shows which prompt (prompt → page), and what the pages leave out
    grid.png               the first page again, under the name earlier versions wrote
    plots/                 score distributions per metric; with a baseline, baseline-vs-this scatters
    baseline/images/...    with a baseline, its images of the paired step counts (for the report)
    report.html            the report; it links only files above, so it renders from the folder alone
    manifest.json          every file's size and sha256; metadata: model URIs, the config, the baseline

:func:`load_evaluation` reads it back as a :class:`g2rpo.evaluation.sampling.EvalResult` (images
as stored, so 8-bit quantised), e.g. to draw a before | after grid of two evaluations with
:func:`g2rpo.evaluation.sampling.save_before_after_grid`. Its JSON files are read back through
:mod:`g2rpo.textfile`'s strict reader as the documents their readers use (:func:`read_document`:
:class:`PromptsDocument`, :class:`MetricsDocument`, ``scores.jsonl``'s rows, ``grid/index.json``): the
manifest vouches for the bytes, not their shape, so one published mis-shaped is named with its first
bad field and the fix.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field

from g2rpo.artifacts.cache import fetch_to_cache
from g2rpo.artifacts.manifest import has_manifest, read_manifest
from g2rpo.artifacts.scores import EvalScores, ScoreItem
from g2rpo.artifacts.storage import FileStore, S3Settings, Store, locate, open_store
from g2rpo.data import dedupe_prompts, read_prompt_file
from g2rpo.errors import G2RPOError, problem
from g2rpo.evaluation.sampling import EvalResult
from g2rpo.textfile import JSON_MAX_BYTES, decode_record, read_regular_file

__all__ = [
    "PromptSet",
    "read_prompt_set",
    "image_name",
    "step_image_name",
    "Baseline",
    "load_baseline",
    "check_baseline",
    "png_bytes",
    "load_png",
    "GridPage",
    "grid_page_files",
    "grid_pages",
    "save_score_grid",
    "save_score_grid_pages",
    "score_grid_figure",
    "load_evaluation",
    "eval_result_from",
    "PromptsDocument",
    "MetricsDocument",
    "read_document",
    "read_scores",
]


@dataclass(frozen=True)
class PromptSet:
    """The prompts of an evaluation: where they came from, that file's digest, the texts used."""

    uri: str
    sha256: str
    prompts: list[str]
    read: int = 0  # prompts in the file, duplicates included
    duplicates: int = 0  # exact duplicates dropped (the first occurrence is kept)
    requested: int | None = None  # num_prompts asked for (None: all)

    def notice(self) -> str | None:
        """The limits applied to the file's prompts, in one line, or None when every prompt read is evaluated."""
        unique = self.read - self.duplicates
        said = []
        if self.duplicates:
            said.append(f"{self.duplicates} duplicate prompt(s) in {self.uri} dropped ({unique} unique of {self.read})")
        if self.requested is not None and self.requested > unique:
            said.append(f"num_prompts={self.requested} is more than the {unique} unique prompt(s) there")
        if not said:
            return None
        return "; ".join(said) + f"; evaluating {len(self.prompts)} prompt(s)"


_log = logging.getLogger(__name__)
# The grid is drawn in pages a person can read (a page's rows are prompts, its columns seeds) and whose
# memory does not grow with the evaluation; the pages stop at GRID_PROMPTS_MAX prompts (the paper's
# 400 test prompts fit), every image stays in images/ and report.html.
GRID_PAGE_PROMPTS = 8
GRID_SEEDS_MAX = 8
GRID_PROMPTS_MAX = 400
GRID_DIR = "grid"
GRID_INDEX = f"{GRID_DIR}/index.json"
GRID_FIRST_PAGE = "grid.png"  # the first page again, under the name of the one-picture grid of earlier versions

BUILTIN_PREFIX = "builtin:"

# A prompt's id in every file of the artifact: its index in prompts.json (image names are built from it).
_PROMPT_ID = r"^p[0-9]+$"


class ArtifactDocument(BaseModel):
    """One of an evaluation's JSON files as read back: the keys a reader uses are checked (type and
    presence), any others let through (a later g2rpo may write more)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class PromptEntry(ArtifactDocument):
    prompt_id: str = Field(pattern=_PROMPT_ID)
    prompt: str


class PromptsDocument(ArtifactDocument):
    """``prompts.json``: each prompt_id's text."""

    prompts: list[PromptEntry]


class StepSummary(ArtifactDocument):
    """One metric at one step count (``metrics.json``'s ``by_steps``: g2rpo.evaluation.report.summaries)."""

    mean: float
    std: float
    n: int
    ci_low: float
    ci_high: float


class PairedSummary(ArtifactDocument):
    """One metric against the baseline (g2rpo.evaluation.report.paired_summaries)."""

    mean: float
    baseline_mean: float
    delta: float
    ci_low: float
    ci_high: float
    n: int


class PairedSection(ArtifactDocument):
    uri: str
    paired: dict[int, dict[str, PairedSummary]]  # step count -> metric -> vs the baseline


class MetricsDocument(ArtifactDocument):
    """``metrics.json``: per step count and metric its summary; with a baseline, the paired differences."""

    num_steps: int = Field(description="the gated step count")
    by_steps: dict[int, dict[str, StepSummary]]
    baseline: PairedSection | None = None


class ScoresLine(ArtifactDocument):
    """One line of ``scores.jsonl``: an image of one step count and its scores."""

    steps: int
    prompt_id: str = Field(pattern=_PROMPT_ID)
    seed: int
    image: str
    scores: dict[str, float]


class GridIndexPage(ArtifactDocument):
    file: str


class GridIndex(ArtifactDocument):
    """``grid/index.json``: the grid's pages, in order."""

    pages: list[GridIndexPage]


D = TypeVar("D", bound=BaseModel)


def builtin_prompt_sets() -> dict[str, Path]:
    """The prompt sets packaged with g2rpo (``builtin:NAME``): small sets for the tiny model."""
    folder = Path(str(resources.files("g2rpo") / "evaluation" / "prompts"))
    return {path.stem: path for path in sorted(folder.glob("*.txt"))}


def read_prompt_set(uri: str, num_prompts: int | None = None, settings: S3Settings | None = None) -> PromptSet:
    """The first ``num_prompts`` distinct prompts of the file at ``uri`` (path, file://, s3:// or
    ``builtin:NAME``, a packaged set). An empty set is refused."""
    with tempfile.TemporaryDirectory(prefix="g2rpo-eval-prompts-") as tmp:
        if uri.startswith(BUILTIN_PREFIX):
            sets = builtin_prompt_sets()
            local = sets.get(uri.removeprefix(BUILTIN_PREFIX))
            if local is None:
                raise G2RPOError(
                    problem(
                        "prompts",
                        uri,
                        f"no such packaged set; use one of {', '.join(BUILTIN_PREFIX + n for n in sets)}",
                    )
                )
        elif uri.startswith("s3://"):
            store, key = locate(uri, settings)
            local = Path(tmp) / key
            store.get_file(key, local)
        else:
            local = Path(uri.removeprefix("file://")).expanduser()
        try:
            prompts, duplicates = dedupe_prompts(read_prompt_file(local))
        except G2RPOError as exc:
            raise G2RPOError(str(exc).replace(str(local), uri)) from None
        if not prompts:
            raise G2RPOError(problem("prompts", uri, "the prompt set is empty: give a file with at least one prompt"))
        digest = hashlib.sha256(local.read_bytes()).hexdigest()
    return PromptSet(
        uri=uri,
        sha256=digest,
        prompts=prompts[:num_prompts] if num_prompts else prompts,
        read=len(prompts) + duplicates,
        duplicates=duplicates,
        requested=num_prompts or None,
    )


def image_name(prompt_index: int, seed: int) -> str:
    return f"images/p{prompt_index}_s{seed}.png"


def step_image_name(steps: int, num_steps: int, prompt_index: int, seed: int) -> str:
    """An image's path in the artifact: ``num_steps``'s (the gated count's) under ``images/``, another
    step count's under ``images/T{steps}/``."""
    return image_name(prompt_index, seed) if steps == num_steps else f"images/T{steps}/p{prompt_index}_s{seed}.png"


@dataclass(frozen=True)
class Baseline:
    """A published evaluation to compare with: its scores per step count and where its images are."""

    uri: str
    root: Path  # the verified local copy
    prompts: list[str]
    seeds: list[int]
    by_steps: dict[int, EvalScores]
    images: dict[tuple[int, int, int], str]  # (steps, prompt_index, seed) -> path under root


def load_baseline(uri: str, settings: S3Settings | None = None, cache_dir: str | None = None) -> Baseline:
    """The published evaluation at ``uri`` (fetched and checked against its manifest) as a baseline."""
    store = open_store(uri, settings)
    if not has_manifest(store):
        raise G2RPOError(
            problem("baseline", uri, "holds no published evaluation (no manifest.json); evaluate the baseline first")
        )
    root = fetch_to_cache(uri, cache_dir=cache_dir, settings=settings)
    prompts = [entry.prompt for entry in read_document(root, "prompts.json", uri, PromptsDocument).prompts]
    scores = read_scores(root, uri)
    by_steps: dict[int, list[ScoreItem]] = {}
    images: dict[tuple[int, int, int], str] = {}
    for row in _read_scores_lines(root, uri):
        by_steps.setdefault(row.steps, []).append(ScoreItem(prompt_id=row.prompt_id, seed=row.seed, scores=row.scores))
        images[(row.steps, int(row.prompt_id[1:]), row.seed)] = row.image
    if not by_steps:  # an evaluation from before scores.jsonl: scores.json at its num_steps
        steps = _manifest_num_steps(root, uri)
        by_steps[steps] = list(scores.items)
        images.update(
            {(steps, int(i.prompt_id[1:]), i.seed): image_name(int(i.prompt_id[1:]), i.seed) for i in scores.items}
        )
    return Baseline(
        uri=uri,
        root=root,
        prompts=prompts,
        seeds=list(scores.seeds),
        by_steps={
            steps: EvalScores(
                prompt_set=scores.prompt_set,
                prompt_set_sha256=scores.prompt_set_sha256,
                seeds=scores.seeds,
                items=items,
            )
            for steps, items in by_steps.items()
        },
        images=images,
    )


def check_baseline(baseline: Baseline, prompts: list[str], seeds: list[int], step_counts: list[int]) -> list[int]:
    """The step counts both evaluated; refuses a baseline on other prompts or seeds, or none in common
    (a paired comparison needs the same inputs)."""
    if baseline.prompts != prompts:
        first = next(
            (i for i, (a, b) in enumerate(zip(baseline.prompts, prompts)) if a != b),
            min(len(prompts), len(baseline.prompts)),
        )
        raise G2RPOError(
            problem(
                "baseline",
                baseline.uri,
                f"was evaluated on other prompts ({len(baseline.prompts)} prompts, this {len(prompts)}; first "
                f"difference at p{first}): a paired comparison needs the same prompt set and num_prompts",
            )
        )
    if sorted(baseline.seeds) != sorted(seeds):
        raise G2RPOError(
            problem(
                "baseline", baseline.uri, f"used seeds {baseline.seeds}, this evaluation {seeds}: use the same seeds"
            )
        )
    common = [steps for steps in step_counts if steps in baseline.by_steps]
    if not common:
        raise G2RPOError(
            problem(
                "baseline",
                baseline.uri,
                f"was sampled with T={sorted(baseline.by_steps)}, this with T={step_counts}: evaluate one step count of both",
            )
        )
    return common


def png_bytes(image: torch.Tensor) -> bytes:
    """``[3, H, W]`` in [0, 1] → 8-bit RGB PNG (round to nearest)."""
    array = (image.float().clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


@dataclass(frozen=True)
class GridPage:
    """One page of the grid: its file (relative to the artifact), its number (from 1) and the prompts it shows."""

    file: str
    number: int
    prompts: range  # prompt indices, rows top to bottom


def grid_pages(num_prompts: int) -> list[GridPage]:
    """The pages of a grid of ``num_prompts`` prompts: :data:`GRID_PAGE_PROMPTS` rows each, the first
    :data:`GRID_PROMPTS_MAX` prompts."""
    shown = min(num_prompts, GRID_PROMPTS_MAX)
    starts = range(0, shown, GRID_PAGE_PROMPTS)
    return [
        GridPage(f"{GRID_DIR}/page-{k + 1:03d}.png", k + 1, range(start, min(start + GRID_PAGE_PROMPTS, shown)))
        for k, start in enumerate(starts)
    ]


def save_score_grid_pages(
    result: EvalResult, root: str | Path, title: str = "", say: Callable[[str], None] = lambda _: None
) -> list[GridPage]:
    """Write every page of the grid under ``root`` (``grid/page-NNN.png``), the index ``grid/index.json``
    (prompt → page) and ``grid.png`` (the first page, the earlier name); returns the pages. ``say`` gets
    a line per page drawn (about a second each on a CPU: eight of them are a silent ten seconds otherwise)."""
    root = Path(root)
    pages = grid_pages(len(result.prompts))
    seeds_shown = result.seeds[:GRID_SEEDS_MAX]
    if len(pages) * GRID_PAGE_PROMPTS < len(result.prompts) or len(seeds_shown) < len(result.seeds):
        _log.warning(
            "the grid pages show %d of %d prompts and %d of %d seeds (at most %d prompts, %d seeds); "
            "scores.json, images/ and report.html hold every one",
            min(len(result.prompts), GRID_PROMPTS_MAX),
            len(result.prompts),
            len(seeds_shown),
            len(result.seeds),
            GRID_PROMPTS_MAX,
            GRID_SEEDS_MAX,
        )
    (root / GRID_DIR).mkdir(parents=True, exist_ok=True)
    for page in pages:
        save_score_grid(result, root / page.file, title, page=page.number)
        say(f"grid page {page.number}/{len(pages)} drawn")
    index = {
        "prompts_per_page": GRID_PAGE_PROMPTS,
        "prompts_total": len(result.prompts),
        "seeds_shown": list(seeds_shown),
        "seeds_total": len(result.seeds),
        "pages": [{"file": page.file, "prompts": [f"p{p}" for p in page.prompts]} for page in pages],
        "prompt_page": {
            f"p{p}": {"prompt": result.prompts[p], "page": page.file} for page in pages for p in page.prompts
        },
    }
    (root / GRID_INDEX).write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    if pages:
        (root / GRID_FIRST_PAGE).write_bytes((root / pages[0].file).read_bytes())
    return pages


def grid_page_files(store: Store) -> list[str]:
    """The grid's page files of the evaluation in ``store``, in order: from ``grid/index.json``, or
    ``grid.png`` alone for an evaluation written before the grid had pages; none when neither is there."""
    if store.exists(GRID_INDEX):
        data = store.get_bytes(GRID_INDEX, max_bytes=JSON_MAX_BYTES)[0]
        fix = f"the evaluation {store.uri} was published with it: evaluate again into a new output_uri"
        return [page.file for page in decode_record(GridIndex, data, store.uri_for(GRID_INDEX), fix=fix).pages]
    return [GRID_FIRST_PAGE] if store.exists(GRID_FIRST_PAGE) else []


def save_score_grid(result: EvalResult, path: str | Path, title: str = "", page: int = 1) -> Path:
    """One page of the grid as a PNG: a row per prompt, a column per seed, each image titled with its scores."""
    fig = score_grid_figure(result, title, page)
    path = Path(path)
    fig.savefig(path)
    fig.clear()
    return path


def score_grid_figure(result: EvalResult, title: str = "", page: int = 1):
    """The matplotlib figure of page ``page`` (from 1) of the grid, :func:`save_score_grid` saves it (the
    caller closes it). Its heading says which prompts of how many it shows, and which seeds."""
    import matplotlib  # heavy: only the grid needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pages = grid_pages(len(result.prompts))
    if not 1 <= page <= len(pages):
        raise G2RPOError(problem("page", page, f"the grid of {len(result.prompts)} prompts has pages 1-{len(pages)}"))
    shown = pages[page - 1].prompts
    rows, cols = len(shown), min(len(result.seeds), GRID_SEEDS_MAX)
    where = f"page {page} of {len(pages)}: prompts p{shown[0]}-p{shown[-1]} of {len(result.prompts)}"
    if len(pages) * GRID_PAGE_PROMPTS < len(result.prompts):
        where += f" (the pages show the first {GRID_PROMPTS_MAX})"
    if cols < len(result.seeds):
        where += f" · the first {cols} of {len(result.seeds)} seeds"
    names = list(result.scores)
    # The whole prompt, wrapped, left of its row (position and background are at its end); the
    # constrained layout makes room for it, the column heads and the wrapped title, so nothing is cut
    # or overlaps.
    width = 1.9 * cols + 2.2
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(width, (1.7 + 0.15 * len(names)) * rows + 1.0),
        dpi=100,
        squeeze=False,
        layout="constrained",
    )
    for row, p in enumerate(shown):
        for s in range(cols):
            ax = axes[row, s]
            ax.imshow(result.images[p, s].permute(1, 2, 0).float().numpy(), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            lines = [f"seed {result.seeds[s]}"] if row == 0 else []
            lines += [f"{name} {float(result.scores[name][p, s]):.3f}" for name in names]
            ax.set_title("\n".join(lines), fontsize=6)
        label = textwrap.fill(f"p{p}: {result.prompts[p]}", width=26)
        axes[row, 0].set_ylabel(label, fontsize=6, rotation=0, ha="right", va="center")
    means = ", ".join(f"{name} {result.mean(name):.4f}" for name in names)
    heading = f"{title + ': ' if title else ''}mean {means} (all prompts) · {where} · rows: prompts, columns: seeds"
    fig.suptitle(textwrap.fill(heading, width=int(width * 72 / 8 / 0.62)), fontsize=8)
    plt.close(fig)  # out of pyplot's registry; the figure itself stays usable
    return fig


def load_evaluation(output_uri: str, settings: S3Settings | None = None, cache_dir: str | None = None) -> EvalResult:
    """The evaluation published at ``output_uri`` (every file checked against its manifest):
    its prompts, seeds, images ``[P, S, 3, H, W]`` (8-bit, as stored) and scores ``[P, S]`` per metric."""
    root = fetch_to_cache(output_uri, cache_dir=cache_dir, settings=settings)
    scores = read_scores(root, output_uri)
    listed = read_document(root, "prompts.json", output_uri, PromptsDocument).prompts
    prompts = [entry.prompt for entry in listed]
    ids = {entry.prompt_id: i for i, entry in enumerate(listed)}
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
            torch.stack([load_png(root / image_name(p, seed), output_uri) for seed in scores.seeds])
            for p in range(len(prompts))
        ]
    )  # [P, S, 3, H, W]
    return EvalResult(prompts=prompts, seeds=list(scores.seeds), images=images, scores=table)


def eval_result_from(root: Path, prompts: list[str], seeds: list[int], scores: EvalScores, uri: str) -> EvalResult:
    """num_steps's images as published (8-bit) and score tables ``[P, S]``."""
    images = torch.stack(
        [torch.stack([load_png(root / image_name(p, seed), uri) for seed in seeds]) for p in range(len(prompts))]
    )  # [P, S, 3, H, W]
    table = {
        metric: torch.tensor([[scores.keyed(metric)[(f"p{p}", seed)] for seed in seeds] for p in range(len(prompts))])
        for metric in scores.metric_names()
    }
    return EvalResult(prompts=list(prompts), seeds=list(seeds), images=images, scores=table)


def _fix(uri: str) -> str:
    # The files are read after fetch_to_cache matched every byte to the manifest: a bad one was published so.
    return f"the evaluation {uri} was published with it: evaluate again into a new output_uri"


def _read_bytes(root: Path, name: str, uri: str) -> bytes:
    path = root / name
    if not path.exists():
        raise G2RPOError(problem("output_uri", uri, f"has no {name}: it is not an evaluation artifact"))
    return read_regular_file(path, what="evaluation file", max_bytes=JSON_MAX_BYTES, fix=_fix(uri))


def read_document(root: Path, name: str, uri: str, cls: type[D]) -> D:
    """The JSON file ``name`` of the evaluation published at ``uri`` (its verified copy under ``root``)
    as ``cls``; a missing, damaged or mis-shaped one is a G2RPOError naming the file, what is wrong
    (the first bad field) and the fix."""
    return decode_record(cls, _read_bytes(root, name, uri), f"evaluation file {str(root / name)!r}", fix=_fix(uri))


def read_scores(root: Path, uri: str) -> EvalScores:
    """``scores.json`` of the evaluation at ``uri`` (see :func:`read_document`)."""
    return read_document(root, "scores.json", uri, EvalScores)


def _read_scores_lines(root: Path, uri: str) -> list[ScoresLine]:
    """``scores.jsonl``'s rows (none for an evaluation written before it), each checked as a ScoresLine."""
    if not (root / "scores.jsonl").exists():
        return []
    lines = _read_bytes(root, "scores.jsonl", uri).split(b"\n")
    where = f"evaluation file {str(root / 'scores.jsonl')!r}"
    return [
        decode_record(ScoresLine, line, f"line {number} of {where}", fix=_fix(uri))
        for number, line in enumerate(lines, start=1)
        if line.strip() or number < len(lines)  # the file's final newline ends the last line
    ]


def _manifest_num_steps(root: Path, uri: str) -> int:
    """The gated step count an evaluation's manifest records (``metadata.config.num_steps``)."""
    config = read_manifest(FileStore(root)).metadata.get("config")
    steps = config.get("num_steps") if isinstance(config, dict) else None
    if not isinstance(steps, int) or isinstance(steps, bool):
        raise G2RPOError(
            problem(
                "baseline",
                uri,
                f"has no scores.jsonl and its manifest records no metadata.config.num_steps (found {steps!r}): "
                "it is not an evaluation g2rpo published; evaluate the baseline again",
            )
        )
    return steps


def load_png(path: Path, uri: str) -> torch.Tensor:
    if not path.is_file():
        raise G2RPOError(
            problem(
                "output_uri", uri, f"lacks {path.parent.name}/{path.name}: the artifact is incomplete; evaluate again"
            )
        )
    array = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255.0  # [H, W, 3]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()
