"""Run every CPU benchmark in turn (what `make bench` does).

Each benchmark writes its own JSON under ``benchmarks/results/`` and prints its table. The GPU
benchmark (``benchmarks/gpu_flux_step.py``) is not run here: it needs a CUDA device. The ablation
(``benchmarks/ablation.py``, ``make ablation``, about 30 minutes) runs on its own.
"""

from __future__ import annotations

import sys

from benchmarks import bench_rewards, bench_storage, bench_train, decode, memory, rollout, uint8_round_trip

CPU_BENCHMARKS = {
    "G²RPO rollout (project vs reference-structured loop: time, forwards, calls)": rollout.main,
    "reward heads (batched vs per-image PIL)": bench_rewards.main,
    "reward heads: score change from the references' 8-bit input": uint8_round_trip.main,
    "training iteration (seconds per phase, NFE)": bench_train.main,
    "storage (publish/fetch throughput, conditional-write race probe)": bench_storage.main,
    "rollout peak memory at FLUX.1-dev shapes (conditioning copied vs broadcast)": memory.main,
    "VAE decode time vs images per call, decode memory at Flux size": decode.main,
}


def main(argv: list[str] | None = None) -> int:
    for title, run in CPU_BENCHMARKS.items():
        print(f"\n=== {title} ===", flush=True)
        run([])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
