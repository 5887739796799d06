"""`g2rpo model quality-shapes` scores the demo's base model by default."""

from __future__ import annotations

import json

import pytest

from g2rpo.cli import main
from g2rpo.models.shapes import SHIPPED_UNSEEN_MODEL


@pytest.mark.integration
def test_quality_shapes_scores_the_demos_base_model_by_default(tmp_path, capsys):
    report = tmp_path / "quality.json"
    assert main(["model", "quality-shapes", "--seeds", "0", "--num-steps", "1", "--json", str(report)]) == 0
    printed = capsys.readouterr().out
    # shapes_flux_unseen: the model `make demo` starts from, whose held-out means the README's table shows
    assert printed.startswith(f"{SHIPPED_UNSEEN_MODEL}: 64 held-out prompts × seeds [0], T = 1")
    assert json.loads(report.read_text())
