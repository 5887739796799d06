"""Which attention kernel lets FLUX.1-dev's transformer back-propagate on this GPU: one G²RPO term's
forward + backward (bf16, gradient checkpointing, 720²: 2025 image + 512 text tokens) through a
two-block model of FLUX.1-dev's widths, with scaled-dot-product attention limited to one backend.

Run by ``benchmarks/gpu_run.sh`` before the measurements, one process per backend (an illegal memory
access poisons the CUDA context), after the first GPU run stopped in the backward with
CUBLAS_STATUS_EXECUTION_FAILED / an illegal memory access. Prints one JSON line.

Usage: ``python -m benchmarks.gpu_diag {default,flash,efficient,cudnn,math} [--no-checkpointing] [--device cpu --tiny]``
"""

from __future__ import annotations

import argparse
import json
import sys
import time

BACKENDS = ("default", "flash", "efficient", "cudnn", "math")


def apply_sdpa_backends(torch, names: str | None, device: str = "cuda") -> list[str]:
    """Enable only the named SDPA backends process-wide (comma-separated). ``"default"``: torch's own choice;
    None: the trainer's (torch's with cuDNN's kernel off on CUDA, :func:`g2rpo.models.flux.avoid_cudnn_attention`)."""
    if names is None:
        from g2rpo.models.flux import avoid_cudnn_attention

        avoid_cudnn_attention(torch.device(device))
        return ["trainer's: flash, efficient, math" if device.startswith("cuda") else "default"]
    if names == "default":
        return ["default"]
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in BACKENDS[1:]]
    if unknown:
        raise SystemExit(f"--sdpa: unknown backend(s) {unknown}; choose from {', '.join(BACKENDS[1:])}")
    torch.backends.cuda.enable_flash_sdp("flash" in chosen)
    torch.backends.cuda.enable_mem_efficient_sdp("efficient" in chosen)
    torch.backends.cuda.enable_cudnn_sdp("cudnn" in chosen)
    torch.backends.cuda.enable_math_sdp("math" in chosen)
    return chosen


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_diag", description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    import torch

    from benchmarks import gpu_flux_step
    from g2rpo.models.flux import FluxConditioning, FluxVelocity, packed_shape

    record: dict = {"backend": args.backend, "checkpointing": not args.no_checkpointing}
    started = time.perf_counter()
    try:
        apply_sdpa_backends(torch, args.backend, args.device)
        ns = gpu_flux_step.parse_args(
            [
                "--device",
                args.device,
                "--layers",
                "1" if args.tiny else "2",
                "--single-layers",
                "1" if args.tiny else "2",
            ]
            + (["--tiny"] if args.tiny else [])
        )
        transformer, config = gpu_flux_step.build_transformer(torch, ns)
        velocity = FluxVelocity(
            transformer, height=ns.size, width=ns.size, guidance=3.5, gradient_checkpointing=not args.no_checkpointing
        ).to(args.device)
        length, channels = packed_shape(ns.size, ns.size)
        gen = torch.Generator(device=args.device).manual_seed(1)
        cond = FluxConditioning(
            torch.randn(1, ns.text_tokens, config["joint_attention_dim"], device=args.device, dtype=torch.bfloat16),
            torch.randn(1, config["pooled_projection_dim"], device=args.device, dtype=torch.bfloat16),
        )
        inputs = {
            "x": torch.randn(1, length, channels, device=args.device, generator=gen),
            "cond": cond,
            "branches": torch.randn(1, 12, length, channels, device=args.device, generator=gen),
            "lp_old": torch.zeros(1, 12, device=args.device),
            "adv": torch.randn(1, 12, device=args.device, generator=gen),
        }
        for _ in range(2):
            gpu_flux_step.g2rpo_term(torch, velocity, inputs).backward()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        grads = [p.grad for p in transformer.parameters() if p.grad is not None]
        record.update(ok=True, finite=bool(all(torch.isfinite(g).all() for g in grads)), error=None)
    except Exception as exc:  # noqa: BLE001 — the point is to report it
        record.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:600]}")
    record["seconds"] = time.perf_counter() - started
    print("gpu_diag " + json.dumps(record), flush=True)
    return record


if __name__ == "__main__":
    main(sys.argv[1:])
