"""The runnable example of docs/core.md (the two interfaces driven by a written-out loop) runs as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "core.md"


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_core_doc_example_runs(capsys):
    blocks = _python_blocks(DOC)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(DOC), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(10))  # one line per iteration
    rewards = [float(line.split()[1]) for line in lines]
    assert all(r < 0 for r in rewards)  # the toy reward is −mean squared distance: finite and below 0
    # 4 prompts, T = 8, G = 8, M = {0..3}, Λ = {1, 2, 3}: 4·(4 + 8·35) = 1136 sampling forwards, 4·4 training
    assert lines[0].split()[2:] == ["1136", "16"]
