"""Hostile or oversized inputs end in a bounded, clear refusal, not a traceback: YAML alias bombs and
huge config files in `validate` (and gates, and overrides), absurd seed counts in an evaluation
(refused before any model loads), and grid pages whose size does not grow with the evaluation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from g2rpo.cli import main
from g2rpo.config import CONFIG_MAX_BYTES, YAML_NODES_MAX, parse_overrides
from g2rpo.errors import G2RPOError

REPO = Path(__file__).resolve().parents[2]

# "Billion laughs" in a real field: nine levels of nine aliases, 9 ** 9 strings from a few hundred bytes.
_LEVELS = ["&b0 [q, q, q, q, q, q, q, q, q]"] + [f"&b{i} [{', '.join([f'*b{i - 1}'] * 9)}]" for i in range(1, 9)]
BOMB = f"train:\n  lora:\n    target_modules: [{', '.join(_LEVELS)}]\n"


def test_validate_refuses_a_yaml_alias_bomb_quickly(tmp_path, capsys):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    started = time.monotonic()
    assert main(["validate", "--config", str(path)]) == 2
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert f"more than {YAML_NODES_MAX:,} YAML nodes" in err and "alias" in err and "Traceback" not in err
    # the same in a command-line override: 10 ** 7 nodes from one line
    levels = ["&b0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [f"&b{i} [{', '.join([f'*b{i - 1}'] * 10)}]" for i in range(1, 7)]
    with pytest.raises(G2RPOError, match="alias bomb"):
        parse_overrides([f"x=[{', '.join(levels)}]"])
    # a recursive alias is refused too
    (tmp_path / "loop.yaml").write_text("a: &a [*a]\n")
    assert main(["validate", "--config", str(tmp_path / "loop.yaml")]) == 2
    assert "YAML nodes" in capsys.readouterr().err


def test_validate_refuses_a_huge_config_file_before_parsing_it(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    path.write_text("# padding\n" * (CONFIG_MAX_BYTES // 10 + 1))
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"over the {CONFIG_MAX_BYTES:,}-byte limit for a config file" in err and str(path) in err
    # the shipped configs are far below the limit and still validate
    capsys.readouterr()
    assert main(["validate", "--config", str(REPO / "configs" / "tiny-cpu.yaml")]) == 0
    captured = (
        capsys.readouterr()
    )  # a line at once on stderr (the schema's imports take seconds), the verdict on stdout
    assert captured.err.startswith(f"validating {REPO / 'configs' / 'tiny-cpu.yaml'} for 1 rank(s)")
    assert captured.out.startswith("ok: ")


def test_an_absurd_number_of_seeds_is_refused_up_front(tmp_path, capsys):
    from g2rpo.config import load_config
    from g2rpo.evaluation.config import IMAGES_MAX, SEEDS_MAX, EvaluationConfig
    from g2rpo.steps.evaluate import evaluate

    with pytest.raises(G2RPOError, match=rf"seeds.*at most {SEEDS_MAX}"):
        load_config(EvaluationConfig, None, {"prompts": "builtin:tiny", "seeds": list(range(SEEDS_MAX + 1))})
    prompts = tmp_path / "p.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(IMAGES_MAX // SEEDS_MAX + 1)), encoding="utf-8")
    config = load_config(
        EvaluationConfig, None, {"prompts": str(prompts), "seeds": list(range(SEEDS_MAX)), "device": "cpu"}
    )
    started = time.monotonic()
    with pytest.raises(G2RPOError, match=rf"images, over the {IMAGES_MAX:,} one evaluation holds"):
        evaluate(str(tmp_path / "no-model-needed-yet"), config, str(tmp_path / "ev"))
    assert time.monotonic() - started < 10  # before any model loads or image is drawn


def test_grid_pages_are_bounded_and_say_what_they_show():
    from g2rpo.evaluation.artifact import (
        GRID_PAGE_PROMPTS,
        GRID_PROMPTS_MAX,
        GRID_SEEDS_MAX,
        grid_pages,
        score_grid_figure,
    )
    from g2rpo.evaluation.sampling import EvalResult

    prompts, seeds = [f"p{i}" for i in range(GRID_PROMPTS_MAX + 5)], list(range(GRID_SEEDS_MAX + 3))
    images = torch.zeros(len(prompts), len(seeds), 3, 8, 8)  # [P, S, 3, H, W]
    result = EvalResult(
        prompts=prompts, seeds=seeds, images=images, scores={"m": torch.zeros(len(prompts), len(seeds))}
    )
    pages = grid_pages(len(prompts))
    assert [p for page in pages for p in page.prompts] == list(range(GRID_PROMPTS_MAX))  # each once, in order
    assert max(len(page.prompts) for page in pages) == GRID_PAGE_PROMPTS
    fig = score_grid_figure(result, page=len(pages))
    assert len(fig.axes) == len(pages[-1].prompts) * GRID_SEEDS_MAX
    heading = " ".join(fig._suptitle.get_text().split())
    last = pages[-1].prompts
    assert f"page {len(pages)} of {len(pages)}: prompts p{last[0]}-p{last[-1]} of {len(prompts)}" in heading
    assert f"the pages show the first {GRID_PROMPTS_MAX}" in heading
    assert f"the first {GRID_SEEDS_MAX} of {len(seeds)} seeds" in heading
    with pytest.raises(G2RPOError, match=rf"page={len(pages) + 1}: .* has pages 1-{len(pages)}"):
        score_grid_figure(result, page=len(pages) + 1)
