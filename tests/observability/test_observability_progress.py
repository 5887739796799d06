"""Progress bars: redrawn in place on a terminal, whole throttled lines in a log (a pod, CI, a file)."""

from __future__ import annotations

import io
import os
import sys

import pytest

from g2rpo.errors import G2RPOError
from g2rpo.progress import _Lines, import_saying, progress_bar, quiet_library_bars_in_logs


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_in_a_log_the_bar_is_its_first_and_last_line_when_the_work_is_quick(monkeypatch):
    monkeypatch.delenv("G2RPO_PROGRESS_INTERVAL_S", raising=False)
    log = io.StringIO()
    bar = progress_bar(total=100, desc="g2rpo train", file=log)
    for i in range(100):
        bar.update(1)
        bar.set_postfix(reward=f"{i / 100:.2f}")  # each one is a redraw in tqdm
    bar.close()
    lines = log.getvalue().split("\n")
    assert "\r" not in log.getvalue() and lines[-1] == "" and len(lines) == 3, lines
    assert lines[0].startswith("g2rpo train:   0%") and "0/100" in lines[0]
    assert "100/100" in lines[1] and "reward=0.99" in lines[1] and lines[1].isascii()


def test_lines_are_throttled_to_one_per_interval_and_the_newest_is_kept():
    now = [0.0]
    log = io.StringIO()
    lines = _Lines(log, interval_s=30.0, clock=lambda: now[0])
    lines.write("\rbar 1")  # the first redraw is written at once
    now[0] = 10.0
    lines.write("\rbar 2")  # 10 s later: held
    now[0] = 20.0
    lines.write("\rbar 3")  # held, replaces bar 2
    assert log.getvalue() == "bar 1\n"
    now[0] = 31.0
    lines.write("\rbar 4")  # 31 s after the last line: written, bars 2 and 3 never are
    now[0] = 32.0
    lines.write("\rbar 5")
    lines.write("\n")  # tqdm closing: the held bar is written now
    lines.write("\n")  # nothing held: nothing more
    assert log.getvalue() == "bar 1\nbar 4\nbar 5\n"


def test_on_a_terminal_the_bar_redraws_in_place():
    term = _Terminal()
    bar = progress_bar(total=3, desc="text embeddings", unit="prompt", file=term)
    for _ in range(3):
        bar.update(1)
    bar.close()
    assert term.getvalue().count("\r") >= 2 and "3/3" in term.getvalue()


def test_a_disabled_bar_prints_nothing_and_still_iterates():
    log = io.StringIO()
    assert list(progress_bar(range(4), desc="x", enabled=False, file=log)) == [0, 1, 2, 3]
    bar = progress_bar(total=2, desc="x", enabled=False, file=log)
    bar.update(2)
    bar.close()
    assert log.getvalue() == ""


@pytest.mark.parametrize("raw", ["soon", "-5", "nan"])
def test_a_bad_log_interval_names_the_variable_the_value_and_the_fix(monkeypatch, raw):
    monkeypatch.setenv("G2RPO_PROGRESS_INTERVAL_S", raw)
    with pytest.raises(G2RPOError, match=f"G2RPO_PROGRESS_INTERVAL_S.*{raw}.*seconds between progress lines"):
        progress_bar(total=1, desc="x", file=io.StringIO())


def test_library_bars_are_turned_off_in_a_log_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    assert not quiet_library_bars_in_logs(_Terminal())
    assert "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ
    assert quiet_library_bars_in_logs(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # the user wants them
    assert not quiet_library_bars_in_logs(io.StringIO())
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "0"


def test_a_disabled_bar_does_not_read_the_log_interval(monkeypatch):
    monkeypatch.setenv("G2RPO_PROGRESS_INTERVAL_S", "soon")
    assert list(progress_bar(range(2), desc="x", enabled=False, file=io.StringIO())) == [0, 1]


def test_each_library_is_said_before_it_is_imported_and_a_loaded_one_not_at_all(tmp_path, monkeypatch):
    for name in ("slow_library_a", "slow_library_b"):
        (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("slow_library_a", "slow_library_b"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    said: list[tuple[str, bool]] = []  # (label, was its module loaded when it was said)
    modules = [("json", "json"), ("library A", "slow_library_a"), ("library B", "slow_library_b")]
    import_saying(modules, lambda label: said.append((label, dict(modules)[label] in sys.modules)))
    assert said == [("library A", False), ("library B", False)]  # json was loaded already
    assert "slow_library_a" in sys.modules and "slow_library_b" in sys.modules
