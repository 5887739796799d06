"""Peak resident memory of one piece of work, measured in a fresh interpreter (Linux ``/proc``).

Shared by the memory benchmarks (``benchmarks/memory.py``, ``benchmarks/decode.py``): each case runs
in its own subprocess (``python -m benchmarks.<module> --case <json>``) so that its peak starts from a
clean heap; inside it, :func:`reset_peak` sets the kernel's high-water mark ``VmHWM`` to the current
resident size (writing ``5`` to ``/proc/self/clear_refs``), the work runs, and the peak is ``VmHWM``
after it minus ``VmRSS`` before it (:func:`status`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parent.parent  # the subprocesses import benchmarks and g2rpo from here


def status() -> dict[str, int]:
    """``VmHWM`` and ``VmRSS`` of this process, in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def reset_peak() -> bool:
    """Set ``VmHWM`` to the current resident size; False where ``clear_refs`` cannot be written."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def run_case(module: str, case: Any) -> dict:
    """``python -m <module> --case <json of case>`` in a fresh interpreter; its last stdout line as JSON."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--case", json.dumps(case)],
        check=True,
        cwd=CHECKOUT,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
