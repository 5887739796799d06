"""The trainer image's DeepSpeed ops, checked where the image is built: no GPU there, and in the runtime
stage no compiler either.

A GPU-less build of DeepSpeed silently picks the CPU accelerator: it compiles its ops with g++ only and
records ``accelerator_name='cpu'``; on an H200 node DeepSpeed's loader then sees a CUDA accelerator, does
not trust the prebuilt ops and tries to compile them (no nvcc in the runtime image: "Error building
extension 'fused_adam'"). So this checks what the loader will check: the recorded accelerator is CUDA,
each op is installed, and ``create_op_builder(...).load()`` (DeepSpeed's own path) returns the module
shipped in the package, not one compiled into the extensions folder.

Usage: ``DS_ACCELERATOR=cuda python check_deepspeed_ops.py OP [OP ...]`` (e.g. ``fused_adam cpu_adam``).
Exit 0 when every op loads prebuilt; 1 with every problem listed otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

import deepspeed
from deepspeed.accelerator import get_accelerator
from deepspeed.git_version_info import accelerator_name, installed_ops

# The op's name in installed_ops -> its builder class (the accelerator's create_op_builder name).
BUILDERS = {"fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder"}


def problems_before_loading(ops: list[str]) -> list[str]:
    problems = []
    if accelerator_name != "cuda":
        problems.append(f"DeepSpeed was built for accelerator {accelerator_name!r}: build it with DS_ACCELERATOR=cuda")
    if get_accelerator()._name != "cuda":
        problems.append(f"the running accelerator is {get_accelerator()._name!r}: run this with DS_ACCELERATOR=cuda")
    for op in ops:
        if op not in BUILDERS:
            problems.append(f"{op}: unknown op; this check knows {sorted(BUILDERS)}")
        elif not installed_ops.get(op):
            problems.append(f"{op}: not prebuilt; build with DS_BUILD_{op.upper()}=1")
    return problems


def main(ops: list[str]) -> int:
    if not ops:
        print(__doc__, file=sys.stderr)
        return 2
    problems = problems_before_loading(ops)
    if not problems:
        package = Path(deepspeed.__file__).resolve().parent
        for op in ops:
            module = get_accelerator().create_op_builder(BUILDERS[op]).load(verbose=False)
            where = Path(module.__file__).resolve()
            if package not in where.parents:
                problems.append(f"{op}: loaded from {where}, i.e. compiled at load time, not prebuilt")
            else:
                print(f"{op}: prebuilt for {accelerator_name}, loaded from {where}")
    for line in problems:
        print(f"DeepSpeed ops: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
