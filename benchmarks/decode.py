"""VAE decode time against ``micro_batch`` (images per ``vae.decode`` call), and the memory a call
needs at FLUX.1-dev size: where ``train.decode_micro_batch``'s default comes from.

Timing (``time.perf_counter``, ``torch`` on ``--threads`` threads): the same ``--images`` packed
latents are decoded with :func:`g2rpo.models.flux.decode_latents` at every micro-batch in
``--micro-batches``; one warm-up pass, then ``--repeats`` rounds, each round visiting every
micro-batch once (interleaved, so drift on a shared machine hits all of them alike); the median
seconds per image is reported, with min–max, and the ratio to the fastest micro-batch.

Models (real ``diffusers.AutoencoderKL`` classes):

- ``tiny``: the tiny Flux pipeline's VAE (:func:`g2rpo.models.tiny.build_tiny_flux_pipeline`), 64²;
- ``shapes``: the shapes model's VAE, untrained (:func:`g2rpo.models.shapes.shapes_pipeline`; the
  same architecture as ``tiny``, other weights; decode time does not depend on the weights), 64²;
- ``flux-vae``: FLUX.1-dev's VAE architecture (``block_out_channels`` 128/256/512/512, two layers per
  block, 16 latent channels), random weights, timed at ``--flux-size`` (CPU cannot afford 720²).

Memory at Flux size: for ``flux-vae`` two fresh subprocesses decode one and two images at
``--flux-memory-size`` in float32 and report ``VmHWM − VmRSS before`` (high-water mark reset through
``/proc/self/clear_refs``); their difference is the memory one more image in a call costs. Scaled
by the pixel count to 720² and halved for bf16 it estimates the per-image decode memory on a GPU
(an estimate: convolution activations grow with the pixels; the mid-block attention over
(H/8)·(W/8) tokens grows faster where it is materialised).

Writes ``benchmarks/results/decode.json`` and prints a table.

Usage: ``python -m benchmarks.decode [--images 64] [--repeats 3] [--flux-size 64] [--flux-memory-size 256]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import peak_memory
from benchmarks.report import provenance, write_result
from g2rpo.models.flux import decode_latents, packed_shape, vae_scale_factor_of
from g2rpo.models.shapes import shapes_pipeline
from g2rpo.models.tiny import TINY_IMAGE_SIZE, build_tiny_flux_pipeline

RESULTS = Path(__file__).resolve().parent / "results"
FLUX_TARGET_SIZE = 720  # the FLUX.1-dev run's image side (configs/flux-dev-h200.yaml)
MIB = 2**20


def flux_vae() -> torch.nn.Module:
    """FLUX.1-dev's ``AutoencoderKL`` architecture with random weights (seeded)."""
    # diffusers is the models' dependency; imported here so the module's head stays light for --case runs
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        latent_channels=16,
        norm_num_groups=32,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    ).eval()


def _latents(vae: torch.nn.Module, images: int, size: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    length, channels = packed_shape(size, size, vae.config.latent_channels, vae_scale_factor_of(vae))
    return torch.randn(images, length, channels, generator=gen)


def time_micro_batches(
    vae: torch.nn.Module, size: int, images: int, micro_batches: list[int], repeats: int
) -> list[dict]:
    latents = _latents(vae, images, size)
    decode_latents(vae, latents[: max(micro_batches)], size, size, micro_batch=max(micro_batches))  # warm-up
    seconds: dict[int, list[float]] = {m: [] for m in micro_batches}
    for _ in range(repeats):
        for micro in micro_batches:
            start = time.perf_counter()
            decode_latents(vae, latents, size, size, micro_batch=micro)
            seconds[micro].append((time.perf_counter() - start) / images)
    best = min(statistics.median(s) for s in seconds.values())
    return [
        {
            "micro_batch": m,
            "seconds_per_image": statistics.median(s),
            "min": min(s),
            "max": max(s),
            "vs_fastest": statistics.median(s) / best,
        }
        for m, s in seconds.items()
    ]


def memory_case(images: int, size: int, threads: int) -> dict:
    """Peak resident memory of one float32 ``flux-vae`` decode call of ``images`` images."""
    torch.set_num_threads(threads)
    vae = flux_vae()
    latents = _latents(vae, images, size)
    decode_latents(vae, _latents(vae, 1, 16), 16, 16)  # first-use allocations before the reset
    if not peak_memory.reset_peak():
        raise OSError("cannot reset the high-water mark through /proc/self/clear_refs")
    before = peak_memory.status()
    decode_latents(vae, latents, size, size, micro_batch=images)
    return {"images": images, "size": size, "peak_bytes": peak_memory.status()["VmHWM"] - before["VmRSS"]}


def _memory_subprocess(images: int, size: int, threads: int) -> dict:
    return peak_memory.run_case("benchmarks.decode", [images, size, threads])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64, help="images decoded per pass (tiny and shapes)")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--models", nargs="+", default=["tiny", "shapes", "flux-vae"], choices=["tiny", "shapes", "flux-vae"]
    )
    parser.add_argument("--flux-size", type=int, default=64, help="image side for timing flux-vae on the CPU")
    parser.add_argument("--flux-images", type=int, default=8, help="images per pass for timing flux-vae")
    parser.add_argument("--flux-memory-size", type=int, default=256, help="image side for flux-vae's decode memory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=RESULTS / "decode.json")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: one memory case, print its JSON
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case:
        images, size, threads = json.loads(args.case)
        print(json.dumps(memory_case(images, size, threads)))
        return 0
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    timings = {}
    for name in args.models:
        if name == "flux-vae":
            vae, size, images = flux_vae(), args.flux_size, args.flux_images
        else:
            pipe = build_tiny_flux_pipeline(0) if name == "tiny" else shapes_pipeline(0)
            vae, size, images = pipe.vae.eval(), TINY_IMAGE_SIZE, args.images
        micro = [m for m in args.micro_batches if m <= images]
        timings[name] = {
            "size": size,
            "images": images,
            "parameters": sum(p.numel() for p in vae.parameters()),
            "rows": time_micro_batches(vae, size, images, micro, args.repeats),
        }
    memory = None
    if "flux-vae" in args.models:
        one, two = (_memory_subprocess(n, args.flux_memory_size, args.threads) for n in (1, 2))
        per_image = two["peak_bytes"] - one["peak_bytes"]
        scale = (FLUX_TARGET_SIZE / args.flux_memory_size) ** 2
        memory = {
            "size": args.flux_memory_size,
            "peak_bytes_1_image": one["peak_bytes"],
            "peak_bytes_2_images": two["peak_bytes"],
            "per_image_bytes_float32": per_image,
            "target_size": FLUX_TARGET_SIZE,
            "per_image_bytes_bf16_at_target_estimate": per_image * scale / 2,
        }
    result = {
        "benchmark": "decode",
        **provenance("benchmarks.decode", argv, started),
        "settings": {"repeats": args.repeats, "threads": args.threads, "micro_batches": args.micro_batches},
        "timings": timings,
        "flux_vae_memory": memory,
    }
    write_result(result, args.output, table)
    return 0


def table(result: dict) -> str:
    lines = [f"VAE decode, seconds per image (median of {result['settings']['repeats']}, min–max) and × the fastest"]
    for name, t in result["timings"].items():
        lines.append(f"{name} ({t['size']}², {t['images']} images, {t['parameters'] / 1e6:.2f} M parameters)")
        for row in t["rows"]:
            lines.append(
                f"  micro_batch {row['micro_batch']:>3}: {row['seconds_per_image'] * 1e3:9.2f} ms "
                f"({row['min'] * 1e3:.2f}–{row['max'] * 1e3:.2f})  ×{row['vs_fastest']:.2f}"
            )
    m = result["flux_vae_memory"]
    if m:
        lines.append(
            f"flux-vae decode memory at {m['size']}²: 1 image {m['peak_bytes_1_image'] / MIB:.0f} MiB, 2 images "
            f"{m['peak_bytes_2_images'] / MIB:.0f} MiB → {m['per_image_bytes_float32'] / MIB:.0f} MiB per image (float32); "
            f"at {m['target_size']}² in bf16 ≈ {m['per_image_bytes_bf16_at_target_estimate'] / 2**30:.2f} GiB per image"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
