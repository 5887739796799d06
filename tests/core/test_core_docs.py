"""The runnable example in docs/core.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "core.md"


def test_core_doc_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], str(DOC), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 10
    # 4 prompts, T = 8, G = 8, M = {0..3}, Λ = {1, 2, 3}: 4·(4 + 8·35) = 1136 sampling forwards, 4·4 training
    assert lines[0].split()[2:] == ["1136", "16"]
