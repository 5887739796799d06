"""grid.png and the scatter plots: every title and label inside the figure, none overlapping another."""

from __future__ import annotations

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

from g2rpo.evaluation.artifact import save_score_grid, score_grid_figure
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
