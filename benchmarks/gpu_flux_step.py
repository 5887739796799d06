"""One G²RPO training term on a FLUX.1-dev-sized transformer on one GPU: TFLOP/s and MFU.

Prepared for a machine with a CUDA device (none was lent while this was written; run it where a
GPU exists). On the CPU only its code path is checked: a test runs it with ``--device cpu`` on a
one-block transformer at 64×64 (the numbers of such a run mean nothing). What it does:

1. **Matmul ceiling.** Times a bf16 ``[n, n] @ [n, n]`` GEMM (n = ``--gemm-size``, best of
   ``--repeats``) — the achievable dense bf16 TFLOP/s of this device, the denominator of MFU.
   The datasheet peak is printed next to it when the device is known (H100/H200 SXM: 989 dense
   bf16 TFLOP/s).
2. **Model.** ``FluxTransformer2DModel`` with FLUX.1-dev's configuration (19 double + 38 single
   blocks, 24 heads × 128, joint dim 4096, pooled 768, guidance embedding; 11.9B parameters),
   built on the ``meta`` device (no host memory) and materialised directly on the GPU in bf16
   (``to_empty`` + seeded normal init). Random weights: FLOPs and memory do not depend on them.
   ``--lora`` freezes the base and trains peft LoRA adapters on the attention projections.
3. **The G²RPO term** (spec §3, §5): for P groups, **one** forward of the policy at the shared
   state x[k] (P rows, not P·G: the shared-velocity trick), the SDE transition mean, the Gaussian
   log-probability of the G stored branches under it, the clipped surrogate with random
   advantages, and the backward. No optimiser state: full AdamW for 11.9B parameters (fp32 master
   + two moments ≈ 143 GB) does not fit one H200 — that is what ZeRO across 8–16 GPUs is for.
4. **FLOPs** are counted by ``torch.utils.flop_counter.FlopCounterMode`` on one step (matmuls and
   attention, forward + backward), then steps are timed without it:
   ``TFLOP/s = FLOPs / time``, ``MFU = TFLOP/s / ceiling``.

Defaults: 1024×1024 images (4096 image tokens), 512 text tokens, P = 1 group of G = 12,
gradient checkpointing on. Finishes in well under 8 minutes on an H200 (model init ~1 min,
a few timed steps of a few seconds each). Writes ``benchmarks/results/gpu_flux_step.json``.

Usage: ``python -m benchmarks.gpu_flux_step [--size 1024] [--text-tokens 512] [--groups 1]
[--group-size 12] [--steps 3] [--lora] [--no-checkpointing] [--layers 19 --single-layers 38]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

FLUX_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_flux_step",
        description="Forward+backward of one G²RPO loss term on a FLUX.1-dev-sized transformer (bf16, one GPU): "
        "TFLOP/s and MFU against a measured bf16 matmul ceiling.",
    )
    parser.add_argument("--size", type=int, default=1024, help="image side in pixels (multiple of 16; default 1024)")
    parser.add_argument("--text-tokens", type=int, default=512, help="T5 tokens (FLUX.1-dev 512)")
    parser.add_argument(
        "--groups", type=int, default=1, help="P, groups (prompts) in the term: rows of the one forward"
    )
    parser.add_argument("--group-size", type=int, default=12, help="G, branches whose log-prob the term scores")
    parser.add_argument("--steps", type=int, default=3, help="timed steps (after one counted warm-up)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (rank --lora-rank) on a frozen base")
    parser.add_argument("--lora-rank", type=int, default=64, help="LoRA rank")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep all activations (more memory)")
    parser.add_argument("--layers", type=int, default=FLUX_DEV["num_layers"], help="double-stream blocks (19)")
    parser.add_argument(
        "--single-layers", type=int, default=FLUX_DEV["num_single_layers"], help="single-stream blocks (38)"
    )
    parser.add_argument("--gemm-size", type=int, default=8192, help="n of the n×n×n bf16 GEMM ceiling")
    parser.add_argument("--repeats", type=int, default=10, help="GEMM timing repeats")
    parser.add_argument("--output", default=str(RESULTS / "gpu_flux_step.json"), help="JSON result path")
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only checks the code path (tests)")
    return parser.parse_args(argv)


def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_ceiling(torch, n: int, repeats: int, device: str = "cuda") -> float:
    """Best measured dense bf16 TFLOP/s of an n×n×n GEMM."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(torch, device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _sync(torch, device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def build_transformer(torch, args: argparse.Namespace):
    from diffusers import FluxTransformer2DModel

    config = dict(FLUX_DEV, num_layers=args.layers, num_single_layers=args.single_layers)
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to(torch.bfloat16).to_empty(device=args.device)  # dtype set on meta: no fp32 copy on the GPU
    gen = torch.Generator(device=args.device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    if not args.no_checkpointing:
        model.enable_gradient_checkpointing()
    if args.lora:
        from peft import LoraConfig

        model.requires_grad_(False)
        model.add_adapter(
            LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        )
    return model, config


def g2rpo_term(torch, velocity, inputs: dict, args: argparse.Namespace):
    """Loss of one trained step k for P groups: one forward at x[k], G branch log-probs."""
    from g2rpo import core

    x, cond, branches, lp_old, adv = inputs["x"], inputs["cond"], inputs["branches"], inputs["lp_old"], inputs["adv"]
    sigma = torch.full((x.shape[0],), 0.9, device=x.device)
    sigma_next = torch.full((x.shape[0],), 0.85, device=x.device)
    v = velocity(x, sigma, cond)  # [P, L, C] — one row per group
    mean, std = core.sde_mean_std(x, v, sigma, sigma_next, eta=0.7)  # [P, L, C], [P, 1, 1]
    lp_new = core.gaussian_log_prob(branches, mean[:, None], std[:, None], "mean", batch_dims=2)  # [P, G]
    loss, _ = core.clipped_surrogate(lp_new, lp_old, adv, clip_range=1e-4)
    return loss


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_flux_step needs a CUDA device (none visible); see the module docstring")
    from torch.utils.flop_counter import FlopCounterMode

    from g2rpo.models.flux import FluxConditioning, FluxVelocity, packed_shape

    torch.backends.cuda.matmul.allow_tf32 = True
    device_name = torch.cuda.get_device_name() if cuda else f"{device} (code-path check only)"
    ceiling = matmul_ceiling(torch, args.gemm_size, args.repeats, device)
    t0 = time.perf_counter()
    transformer, config = build_transformer(torch, args)
    _sync(torch, device)
    init_seconds = time.perf_counter() - t0
    n_params = sum(p.numel() for p in transformer.parameters())
    n_trainable = sum(p.numel() for p in transformer.parameters() if p.requires_grad)
    velocity = FluxVelocity(transformer, height=args.size, width=args.size, guidance=3.5).to(device)
    length, channels = packed_shape(args.size, args.size)
    p, g = args.groups, args.group_size
    gen = torch.Generator(device=device).manual_seed(1)
    inputs = {
        "x": torch.randn(p, length, channels, device=device, generator=gen),
        "cond": FluxConditioning(
            torch.randn(p, args.text_tokens, 4096, device=device, dtype=torch.bfloat16, generator=gen),
            torch.randn(p, 768, device=device, dtype=torch.bfloat16, generator=gen),
        ),
        "branches": torch.randn(p, g, length, channels, device=device, generator=gen),
        "lp_old": torch.zeros(p, g, device=device),
        "adv": torch.randn(p, g, device=device, generator=gen),
    }
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    counter = FlopCounterMode(display=False)
    with counter:
        g2rpo_term(torch, velocity, inputs, args).backward()
    flops = counter.get_total_flops()
    transformer.zero_grad(set_to_none=True)
    times = []
    for _ in range(args.steps):
        _sync(torch, device)
        start = time.perf_counter()
        g2rpo_term(torch, velocity, inputs, args).backward()
        _sync(torch, device)
        times.append(time.perf_counter() - start)
        transformer.zero_grad(set_to_none=True)
    best = min(times)
    achieved = flops / best / 1e12
    datasheet = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in device_name), None)
    result = {
        "benchmark": "gpu_flux_step",
        "device": device_name,
        "torch": torch.__version__,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
        "parameters": n_params,
        "trainable_parameters": n_trainable,
        "image_size": args.size,
        "image_tokens": length,
        "text_tokens": args.text_tokens,
        "groups": p,
        "group_size": g,
        "lora": args.lora,
        "gradient_checkpointing": not args.no_checkpointing,
        "init_seconds": init_seconds,
        "flops_per_step": flops,
        "step_seconds": times,
        "achieved_tflops": achieved,
        "matmul_ceiling_tflops": ceiling,
        "mfu_vs_measured_ceiling": achieved / ceiling,
        "datasheet_bf16_tflops": datasheet,
        "mfu_vs_datasheet": None if datasheet is None else achieved / datasheet,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(
        f"device {device_name}; {n_params / 1e9:.2f}B parameters ({n_trainable / 1e9:.3f}B trainable), init {init_seconds:.1f} s"
    )
    print(f"{'metric':<32} value")
    for key in (
        "flops_per_step",
        "achieved_tflops",
        "matmul_ceiling_tflops",
        "mfu_vs_measured_ceiling",
        "mfu_vs_datasheet",
        "peak_memory_gib",
    ):
        value = result[key]
        print(f"{key:<32} {value:.4g}" if isinstance(value, float) else f"{key:<32} {value}")
    print(f"step seconds: {', '.join(f'{t:.3f}' for t in times)}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
