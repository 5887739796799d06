"""The runnable examples in docs/core.md and in the README's "two interfaces" section run as written."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "core.md"
README = ROOT / "README.md"


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)


def test_core_doc_example_runs(capsys):
    blocks = _python_blocks(DOC)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(DOC), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    # 4 prompts, T = 8, G = 8, M = {0..3}, Λ = {1, 2, 3}: 4·(4 + 8·35) = 1136 sampling forwards, 4·4 training
    assert lines[0].split()[2:] == ["1136", "16"]


def test_readme_interface_example_runs(capsys):
    # The README's one short example of the two interfaces (issue 2): it must run as printed.
    (block,) = [b for b in _python_blocks(README) if "build_strategy" in b]
    exec(compile(block, str(README), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert [int(line.split()[0]) for line in lines] == list(range(10))  # one line per iteration
    rewards = [float(line.split()[1]) for line in lines]
    assert all(r < 0 for r in rewards)  # the toy reward is −mean squared distance: finite and below 0
