"""The README's demo wall time is a measurement: the figures it quotes are rows of docs/demo.md's wall-time
table, where the machine, its load and the date are written down (issue 42: "measured on an idle machine"),
not an estimate that drifts from the code."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DEMO = ROOT / "docs" / "demo.md"


def _seconds(text: str) -> list[int]:
    """Every ``N min M s`` in ``text``, in seconds, in order."""
    return [int(minutes) * 60 + int(seconds) for minutes, seconds in re.findall(r"(\d+) min (\d+) s\b", text)]


def _wall_time_rows() -> dict[str, dict[str, str]]:
    """docs/demo.md's wall-time table: its rows by their first cell, each a mapping of header to cell."""
    lines = DEMO.read_text(encoding="utf-8").splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("|") and "| command to verdict |" in line]
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_the_readmes_demo_time_is_docs_demos_idle_measurement():
    section = README.read_text(encoding="utf-8").split("## What `make demo` prints", 1)[1].split("\n## ", 1)[0]
    quoted = _seconds(section)
    rows = _wall_time_rows()
    idle = [row for label, row in rows.items() if label.startswith(("first, idle", "second, idle"))]
    assert len(idle) == 2, f"docs/demo.md's wall-time table has no idle first and second run: {list(rows)}"
    measured = [int(row["command to verdict"].removesuffix(" s")) for row in idle]
    assert quoted[:2] == measured, (quoted, measured)  # the first run's, then the second's
    assert "idle" in section
    # every other figure the README quotes is a row of the table too, its load said there
    for seconds in quoted[2:]:
        assert any(row["command to verdict"] == f"{seconds} s" for row in rows.values()), seconds
