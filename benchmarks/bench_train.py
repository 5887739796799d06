"""Seconds per training iteration of the tiny Flux model on this machine, by phase, with NFE counts.

Runs :class:`g2rpo.training.trainer.Trainer` (plain torch mode, fp32, CPU) on the tiny random-weight Flux
pipeline for two settings:

- ``tiny-cpu``: ``configs/tiny-cpu.yaml`` (T = 4, G = 4, Λ = {1, 2}, 2 prompts per iteration);
- ``paper-shape``: the paper's sampler shape at tiny size — T = 16, G = 12, M = the noisiest half
  (|M| = 8), Λ = {1, 2, 3}, one prompt per iteration — so that the NFE counts are the paper's
  per-prompt counts (docs/algorithm.md §8), at 64×64 and with a 135k-parameter transformer.

Each iteration is split into the trainer's four phases — sampling (the strategy's rollout),
decoding (VAE, micro-batched), reward (JPEG compressibility, per image on the CPU), training
(loss forwards, backwards, optimiser step) — as the trainer itself measures them
(``IterationRecord.seconds``). One warm-up iteration, then the mean over ``--iterations``.
Timings on 2 shared cores swing a lot; at tiny size the Python around each forward is a large
part of every phase, so the split says where the *calls* go, not how Flux.1-dev divides its time
(there the sampling forwards dominate: ~2k sampling forwards vs 8 training forward/backwards per
prompt).

After the timed iterations, one validation pass (:meth:`Trainer.validate`, ``train.validation``'s
defaults: 8 prompts × 2 seeds, the deterministic ODE sampler over the run's T steps, decoded and
scored) is timed too: what one validation adds to the run, beside an iteration's cost.

Writes ``benchmarks/results/bench_train.json`` and prints a table.
Usage: ``python -m benchmarks.bench_train [--iterations 3] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]

SETTINGS = {
    "tiny-cpu": {},
    "paper-shape": {
        "algorithm": {"num_steps": 16, "group_size": 12, "micro_batch": 128, "g2rpo": {"granularities": [1, 2, 3]}},
        "train": {"prompts_per_iteration": 1},
    },
}


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def run_setting(name: str, model_dir: Path, work: Path, iterations: int) -> dict:
    import yaml

    from g2rpo.config import load_config
    from g2rpo.training.run_config import RunConfig
    from g2rpo.training.trainer import Trainer

    raw = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    raw = _merge(raw, SETTINGS[name])
    raw = _merge(
        raw,
        {
            "model": {"path": str(model_dir), "create_tiny": False},
            "data": {"prompts": str(REPO / "configs" / "tiny-prompts.txt")},
            "train": {"iterations": iterations + 1, "checkpoint_every": 10_000, "progress": False},
            "output": {"dir": str(work / name), "export": False},
        },
    )
    config = load_config(RunConfig, None, raw)
    trainer = Trainer(config).setup()
    trainer.step()  # warm-up
    records = []
    start = time.perf_counter()
    for _ in range(iterations):
        records.append(trainer.step())
    wall = (time.perf_counter() - start) / iterations
    validation = trainer.validate()
    phases = {
        p: sum(r.seconds[p] for r in records) / iterations for p in ("sampling", "decoding", "reward", "training")
    }
    last = records[-1].stats
    alg = config.algorithm
    return {
        "setting": name,
        "num_steps": alg.num_steps,
        "group_size": alg.group_size,
        "trained_steps": len(alg.g2rpo.all_branch_steps(alg.num_steps)),
        "strides": alg.g2rpo.granularities,
        "prompts_per_iteration": config.train.prompts_per_iteration,
        "image_size": config.model.height,
        "seconds_per_iteration": wall,
        "seconds_by_phase": phases,
        "sampling_forwards": last.sampling_forwards,
        "model_calls": last.model_calls,
        "training_forwards": last.training_forwards,
        "training_backwards": last.training_backwards,
        "decoded_images": records[-1].extra["decoded_images"],
        "validation_seconds": validation.seconds,
        "validation_forwards": validation.forwards,
        "validation_images": validation.forwards // alg.num_steps,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations per setting (after 1 warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated: " + ", ".join(SETTINGS))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from g2rpo.models.tiny import save_tiny_flux

    work = Path(tempfile.mkdtemp(prefix="bench_train_"))
    try:
        model_dir = save_tiny_flux(work / "tiny-flux")
        rows = [run_setting(name, model_dir, work, args.iterations) for name in args.settings.split(",")]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "bench_train",
        "machine": {"platform": platform.platform(), "cpus": torch.get_num_threads(), "torch": torch.__version__},
        "threads": args.threads,
        "iterations": args.iterations,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_train.json").write_text(json.dumps(result, indent=1))
    header = f"{'setting':<12} {'T':>3} {'G':>3} {'|M|':>3} {'Λ':<9} {'P':>2} {'s/iter':>7} {'sample':>7} {'decode':>7} {'reward':>7} {'train':>7} {'NFE samp':>8} {'calls':>6} {'NFE train':>9} {'images':>6} {'val s':>6} {'val NFE':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        p = r["seconds_by_phase"]
        print(
            f"{r['setting']:<12} {r['num_steps']:>3} {r['group_size']:>3} {r['trained_steps']:>3} "
            f"{str(r['strides']):<9} {r['prompts_per_iteration']:>2} {r['seconds_per_iteration']:>7.3f} "
            f"{p['sampling']:>7.3f} {p['decoding']:>7.3f} {p['reward']:>7.3f} {p['training']:>7.3f} "
            f"{r['sampling_forwards']:>8} {r['model_calls']:>6} {r['training_forwards']:>9} {r['decoded_images']:>6} "
            f"{r['validation_seconds']:>6.3f} {r['validation_forwards']:>7}"
        )
    print(f"wrote {RESULTS / 'bench_train.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
