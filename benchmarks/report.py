"""The tail every side-by-side benchmark shares: how it was run, on what, and the JSON and table it leaves.

Used by ``benchmarks/decode.py`` and ``benchmarks/memory.py``: each builds its own result around
:func:`provenance` and hands it to :func:`write_result` with its own table function.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def provenance(module: str, argv: Sequence[str] | None, started: float) -> dict:
    """``command`` (as typed, ``python -m <module> ...``), ``machine`` and ``runtime_seconds`` since ``started``
    (a ``time.perf_counter()`` value)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "command": f"python -m {module} " + " ".join(args),
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "runtime_seconds": time.perf_counter() - started,
    }


def write_result(result: dict, output: Path, table: Callable[[dict], str]) -> None:
    """Write ``result`` as JSON to ``output`` (folders made), then print its table and where it went."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"wrote {output} in {result['runtime_seconds']:.0f} s")
