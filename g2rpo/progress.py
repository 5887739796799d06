"""Progress bars that read well in a terminal and in a pod's log.

On a terminal a bar redraws itself in place, as tqdm does. In a log (a KFP pod, ``kubectl logs``,
CI, a file) a redraw is a carriage return, and a log keeps every one of them: a training run's bar
becomes one line of megabytes that log collectors cut or drop. There the bar is written as whole
lines instead, at most one every ``LOG_INTERVAL_S`` seconds plus the first and the last, each
ending in a newline, with plain ASCII characters.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from tqdm import tqdm

from g2rpo.errors import G2RPOError, problem

LOG_INTERVAL_S = 30.0
"""Seconds between progress lines when the output is not a terminal."""


class _Lines:
    """A text stream for tqdm that turns in-place redraws into whole lines, at most one per ``interval_s``.

    tqdm writes ``"\\r<bar>"`` to redraw (on every update, and on every ``set_postfix``) and ``"\\n"``
    when it closes. The newest bar waits here; it is written when ``interval_s`` has passed since
    the last line, and always for the first redraw and at the close.
    """

    def __init__(self, stream: TextIO, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.interval_s = interval_s
        self.clock = clock
        self.pending: str | None = None
        self.last: float | None = None

    def write(self, text: str) -> int:
        for part in re.split(r"([\r\n])", text):
            if part == "\n":
                self._emit()
            elif part != "\r" and part.strip():
                self.pending = part.rstrip()
                if self.last is None or self.clock() - self.last >= self.interval_s:
                    self._emit()
        return len(text)

    def _emit(self) -> None:
        if self.pending is not None:
            self.stream.write(self.pending + "\n")
            self.pending = None
            self.last = self.clock()

    def flush(self) -> None:
        self.stream.flush()


def _log_interval_s() -> float:
    raw = os.environ.get("G2RPO_PROGRESS_INTERVAL_S")
    if raw is None:
        return LOG_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise G2RPOError(
            problem(
                "G2RPO_PROGRESS_INTERVAL_S", raw, "set seconds between progress lines in logs (e.g. 30), or unset it"
            )
        )
    return value


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def quiet_library_bars_in_logs(stream: Any = None) -> bool:
    """When ``stream`` (stderr by default) is not a terminal, turn off the Hugging Face libraries' bars.

    transformers draws a "Loading weights" bar per model it loads; in a log each is a line of
    carriage returns with nothing to follow. Sets ``HF_HUB_DISABLE_PROGRESS_BARS=1`` unless the
    user set it, which transformers and huggingface_hub read when imported: call this before they
    are. Returns whether the bars were turned off.
    """
    if _is_terminal(stream if stream is not None else sys.stderr):
        return False
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def progress_bar(
    iterable: Iterable[Any] | None = None,
    *,
    total: int | None = None,
    desc: str,
    unit: str = "it",
    enabled: bool = True,
    initial: int = 0,
    leave: bool = True,
    file: TextIO | None = None,
) -> tqdm:
    """A tqdm bar on ``file`` (stderr by default): redrawn in place on a terminal, whole lines in a log.

    ``enabled=False`` gives a bar that prints nothing, so callers update it unconditionally.
    ``G2RPO_PROGRESS_INTERVAL_S`` overrides :data:`LOG_INTERVAL_S` for logs.
    """
    stream = file if file is not None else sys.stderr
    common = {"total": total, "desc": desc, "unit": unit, "initial": initial, "disable": not enabled}
    if not enabled or _is_terminal(stream):
        return tqdm(iterable, file=stream, leave=leave, **common)
    interval = _log_interval_s()
    return tqdm(
        iterable,
        file=_Lines(stream, interval),
        leave=True,  # a log line cannot be taken back; closing writes the last one
        mininterval=min(interval, 1.0),
        ascii=True,
        ncols=100,
        **common,
    )


def import_saying(modules: Sequence[tuple[str, str]], say: Callable[[str], None]) -> None:
    """Import each ``(label, module)`` not loaded yet, calling ``say(label)`` just before it.

    A command whose libraries take seconds to import (torch, diffusers, kfp: 5-10 s together on two
    cores, more on a busy one) says each as it starts, so no stretch of that goes without a line.
    """
    for label, module in modules:
        if module not in sys.modules:
            say(label)
            importlib.import_module(module)
