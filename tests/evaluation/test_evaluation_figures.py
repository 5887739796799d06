"""The grid's pages and the scatter plots: every title and label inside the figure, none overlapping another."""

from __future__ import annotations

import json
import logging

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from g2rpo.artifacts.storage import open_store
from g2rpo.evaluation.artifact import (
    GRID_INDEX,
    GRID_PAGE_PROMPTS,
    GRID_SEEDS_MAX,
    grid_page_files,
    save_score_grid,
    save_score_grid_pages,
    score_grid_figure,
)
from g2rpo.evaluation.sampling import EvalResult

PROMPTS = [
    "a large red circle at the top right on a gray background",
    "a small blue triangle at the bottom left on a white background",
]
METRICS = ["jpeg_compressibility", "shapes_background", "shapes_colour", "shapes_position", "shapes_shape"]


def _result() -> EvalResult:
    generator = torch.Generator().manual_seed(0)
    images = torch.rand(len(PROMPTS), 3, 3, 64, 64, generator=generator)  # [P, S, 3, H, W]
    scores = {name: torch.rand(len(PROMPTS), 3, generator=generator) for name in METRICS}  # [P, S] each
    return EvalResult(prompts=PROMPTS, seeds=[0, 1, 2], images=images, scores=scores)


def test_grid_title_and_prompt_labels_are_whole_inside_the_figure_and_apart():
    fig = score_grid_figure(_result(), title="challenger")
    canvas = FigureCanvasAgg(fig)  # what savefig draws a PNG with
    canvas.draw()
    renderer = canvas.get_renderer()
    page = fig.bbox.padded(0.5)
    title = fig._suptitle
    texts = [title] + [ax.yaxis.label for ax in fig.axes] + [ax.title for ax in fig.axes]
    for text in texts:
        if text.get_text():
            assert page.contains(*text.get_window_extent(renderer).min), text.get_text()
            assert page.contains(*text.get_window_extent(renderer).max), text.get_text()
    # the whole prompt is shown (wrapped), position and background included
    labels = [" ".join(ax.yaxis.label.get_text().split()) for ax in fig.axes if ax.yaxis.label.get_text()]
    assert labels == [f"p{p}: {prompt}" for p, prompt in enumerate(PROMPTS)]
    # the title overlaps no column head
    heads = [ax.title.get_window_extent(renderer) for ax in fig.axes[:3]]
    assert not any(title.get_window_extent(renderer).overlaps(head) for head in heads)
    assert "challenger: mean jpeg_compressibility" in " ".join(title.get_text().split())


def test_save_score_grid_writes_the_figure_as_a_png(tmp_path):
    path = save_score_grid(_result(), tmp_path / "grid.png")
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_the_grid_pages_have_one_size_and_an_index_that_finds_every_shown_prompt(tmp_path, caplog):
    """19 prompts × 11 seeds: pages of GRID_PAGE_PROMPTS rows by GRID_SEEDS_MAX columns (8, 8, 3 rows), each said as drawn;
    the index maps each prompt to the page whose title names it; grid.png is the first page."""
    generator = torch.Generator().manual_seed(0)
    prompts = [f"prompt number {p} with a few words" for p in range(19)]
    seeds = list(range(11))
    result = EvalResult(
        prompts=prompts,
        seeds=seeds,
        images=torch.rand(len(prompts), len(seeds), 3, 16, 16, generator=generator),  # [P, S, 3, H, W]
        scores={"m": torch.rand(len(prompts), len(seeds), generator=generator)},  # [P, S]
    )
    said: list[str] = []
    with caplog.at_level(logging.WARNING):
        pages = save_score_grid_pages(result, tmp_path, title="challenger", say=said.append)
    assert [len(page.prompts) for page in pages] == [GRID_PAGE_PROMPTS, GRID_PAGE_PROMPTS, 3]
    # a line as each page is drawn (each takes about a second), not one after all of them
    assert said == ["grid page 1/3 drawn", "grid page 2/3 drawn", "grid page 3/3 drawn"]
    assert f"show 19 of 19 prompts and {GRID_SEEDS_MAX} of 11 seeds" in caplog.text
    sizes = [Image.open(tmp_path / page.file).size for page in pages]
    # a full page's size does not depend on how many prompts the evaluation has; the last is shorter
    assert sizes[0] == sizes[1] and sizes[2][0] == sizes[0][0] and sizes[2][1] < sizes[0][1]
    assert sizes[0][1] < 3 * sizes[0][0]  # a page, not a strip
    index = json.loads((tmp_path / GRID_INDEX).read_text(encoding="utf-8"))
    assert index["seeds_shown"] == seeds[:GRID_SEEDS_MAX] and index["prompts_total"] == 19
    assert list(index["prompt_page"]) == [f"p{p}" for p in range(19)]
    for page in pages:
        fig = score_grid_figure(result, "challenger", page.number)
        labels = [" ".join(ax.yaxis.label.get_text().split()) for ax in fig.axes if ax.yaxis.label.get_text()]
        for label in labels:
            prompt_id = label.split(":")[0]
            assert index["prompt_page"][prompt_id] == {"prompt": label.split(": ", 1)[1], "page": page.file}
    assert (tmp_path / "grid.png").read_bytes() == (tmp_path / pages[0].file).read_bytes()
    assert grid_page_files(open_store(str(tmp_path))) == [page.file for page in pages]
    (tmp_path / GRID_INDEX).unlink()  # an evaluation from before the pages: its grid.png alone
    assert grid_page_files(open_store(str(tmp_path))) == ["grid.png"]
