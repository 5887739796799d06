"""Flux as the core's velocity model: text conditioning, latent layout, the adapter, VAE decoding.

The core (:mod:`g2rpo.core`, :mod:`g2rpo.strategies.base`) sees a velocity field
``v = model(x [B, L, C] float32, sigma [B] float32, cond)`` with σ = 1 noise and σ = 0 data. This
module makes diffusers' ``FluxTransformer2DModel`` that field, the way ``FluxPipeline`` calls it:

- **Latents.** The VAE's latents ``[B, c, h, w]`` (c = 16, h = H/8, w = W/8 for an H×W image) are
  packed into 2×2 patches: ``[B, (h/2)·(w/2), 4c]`` (64 channels; a 64×64 image is 16 tokens, a
  1024×1024 one 4096). Token ``(i, j)`` carries the position id ``(0, i, j)`` (``img_ids``); text
  tokens carry ``(0, 0, 0)`` (``txt_ids``).
- **Timestep.** The transformer multiplies ``timestep`` and ``guidance`` by 1000 itself, so σ is
  passed, not σ·1000. The pipeline feeds ``t = (σ·1000).to(dtype) / 1000`` (its scheduler keeps
  ``σ·1000`` in float32 and casts it to the latents' dtype): in bf16 that rounds σ to bf16 at the
  scale of 1000, and skipping it moves latents by ~3e-2 over a generation. ``timestep_mode=
  "pipeline"`` (default) reproduces that; ``"truncate"`` feeds ``int(σ·1000)/1000`` as the G²RPO
  reference code does; ``"raw"`` passes σ as given (cast to the model dtype by the transformer).
  The strategies can truncate σ themselves (``algorithm.truncate_timestep``); then use ``"raw"``
  (:func:`timestep_mode_for`) so σ is not rounded twice — that is exactly the reference code, which
  hands the transformer ``int(σ·1000)/1000`` as a float32 tensor.
- **Guidance.** FLUX.1-dev is guidance-distilled: one forward with an embedded guidance scale
  (default 3.5), no classifier-free guidance.
- **Dtypes.** ``x`` arrives in float32 and is cast to the transformer's dtype; the velocity is
  returned as float32 (an exact upcast of the bf16 values). Departure from ``FluxPipeline`` in bf16:
  the pipeline keeps its *latents* in bf16 between steps; here the sampler's state stays float32
  (the core's convention), which is at least as accurate. In float32 the two agree bit for bit
  (``tests/models/test_models_flux.py`` checks it against ``FluxPipeline(output_type="latent")``).
- **Decoding.** ``latents / scaling_factor + shift_factor`` through ``AutoencoderKL.decode``, then
  ``[-1, 1] → [0, 1]`` — the images the reward interface takes.
- **Text.** :class:`FluxTextEncoder` encodes prompts as ``FluxPipeline.encode_prompt`` does: T5
  sequence embeddings ``[B, S, 4096]`` (padded to ``max_sequence_length``) and CLIP's pooled
  embedding ``[B, 768]``. Training reads them from the embedding cache (:mod:`g2rpo.data`) instead,
  so the text encoders need not sit on the accelerator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from g2rpo.core import take_rows
from g2rpo.errors import G2RPOError, problem

_log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_GUIDANCE",
    "avoid_cudnn_attention",
    "FluxConditioning",
    "FluxTextEncoder",
    "FluxVelocity",
    "TimestepMode",
    "decode_latents",
    "image_ids",
    "initial_noise",
    "latent_grid",
    "pack_latents",
    "packed_shape",
    "round_timestep",
    "text_ids",
    "timestep_mode_for",
    "unpack_latents",
    "vae_scale_factor_of",
]

DEFAULT_GUIDANCE = 3.5  # FLUX.1-dev's default embedded guidance (FluxPipeline's guidance_scale)
TimestepMode = Literal["pipeline", "truncate", "raw"]
TIMESTEP_MODES: tuple[str, ...] = ("pipeline", "truncate", "raw")


# --------------------------------------------------------------------------- conditioning


@dataclass(frozen=True)
class FluxConditioning:
    """Text conditioning of a batch: T5 sequence embeddings and CLIP pooled embeddings.

    ``prompt_embeds`` ``[B, S, D]`` (Flux: S ≤ 512, D = 4096), ``pooled_prompt_embeds`` ``[B, P]``
    (Flux: P = 768). Implements the core's ``Conditioning`` protocol: ``len``, indexing along the
    batch (LongTensor with repeats, slice, or int — an int keeps the batch axis) and
    ``repeat_interleave``.

    Indexing and ``repeat_interleave`` go through :func:`g2rpo.core.take_rows`: rows that all name
    one prompt are that prompt's embeddings broadcast (``expand``, no copy), consecutive rows a
    slice; only a gather over several prompts copies. A sampler that conditions hundreds of rows on
    one prompt therefore holds its embeddings once. The results share storage with this batch:
    read them, do not write into them.
    """

    prompt_embeds: torch.Tensor  # [B, S, D]
    pooled_prompt_embeds: torch.Tensor  # [B, P]

    def __post_init__(self) -> None:
        seq, pooled = self.prompt_embeds, self.pooled_prompt_embeds
        if seq.ndim != 3:
            raise G2RPOError(
                problem("prompt_embeds.shape", tuple(seq.shape), "expected [B, S, D] (T5 sequence embeddings)")
            )
        if pooled.ndim != 2:
            raise G2RPOError(
                problem("pooled_prompt_embeds.shape", tuple(pooled.shape), "expected [B, P] (CLIP pooled embeddings)")
            )
        if seq.shape[0] != pooled.shape[0]:
            raise G2RPOError(
                problem(
                    "pooled_prompt_embeds.shape",
                    tuple(pooled.shape),
                    f"batch size differs from prompt_embeds' {seq.shape[0]}; both must hold the same prompts",
                )
            )

    def __len__(self) -> int:
        return int(self.prompt_embeds.shape[0])

    def __getitem__(self, index: torch.Tensor | slice | int | Sequence[int]) -> FluxConditioning:
        if isinstance(index, int):
            index = slice(index, index + 1) if index != -1 else slice(-1, None)
        elif not isinstance(index, (slice, torch.Tensor)):
            index = torch.as_tensor(list(index), dtype=torch.long)
        return FluxConditioning(take_rows(self.prompt_embeds, index), take_rows(self.pooled_prompt_embeds, index))

    def repeat_interleave(self, repeats: int) -> FluxConditioning:
        """Each row ``repeats`` times in place: ``[a, b] → [a, a, b, b]`` for 2 (one row: a broadcast view)."""
        return self[torch.arange(len(self)).repeat_interleave(repeats)]

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> FluxConditioning:
        return FluxConditioning(
            self.prompt_embeds.to(device=device, dtype=dtype),
            self.pooled_prompt_embeds.to(device=device, dtype=dtype),
        )

    @staticmethod
    def cat(items: Sequence[FluxConditioning]) -> FluxConditioning:
        """Concatenate along the batch (all items must share S, D and P)."""
        if not items:
            raise ValueError("FluxConditioning.cat needs at least one item")
        return FluxConditioning(
            torch.cat([c.prompt_embeds for c in items], dim=0),
            torch.cat([c.pooled_prompt_embeds for c in items], dim=0),
        )

    @property
    def sequence_length(self) -> int:
        return int(self.prompt_embeds.shape[1])


# --------------------------------------------------------------------------- latent layout


def latent_grid(height: int, width: int, vae_scale_factor: int = 8) -> tuple[int, int]:
    """Unpacked latent size ``(h, w)`` of an H×W image: ``h = H / f``, ``w = W / f`` (f = 8 for Flux).

    Packing needs h and w even, so H and W must be multiples of ``2f`` (16). ``FluxPipeline``
    silently rounds other sizes down; here they are an error.
    """
    step = 2 * vae_scale_factor
    for name, value in (("height", height), ("width", width)):
        if value <= 0 or value % step:
            raise G2RPOError(
                problem(
                    name,
                    value,
                    f"image sizes must be positive multiples of {step} (VAE factor {vae_scale_factor} × 2×2 packing), e.g. 512, 720, 1024",
                )
            )
    return height // vae_scale_factor, width // vae_scale_factor


def packed_shape(height: int, width: int, latent_channels: int = 16, vae_scale_factor: int = 8) -> tuple[int, int]:
    """``(L, C)`` of the packed latents: ``L = (h/2)·(w/2)`` tokens of ``C = 4c`` channels."""
    h, w = latent_grid(height, width, vae_scale_factor)
    return (h // 2) * (w // 2), 4 * latent_channels


def pack_latents(latents: torch.Tensor) -> torch.Tensor:
    """``[B, c, h, w] → [B, (h/2)·(w/2), 4c]``: token (i, j) holds the 2×2 patch at rows 2i..2i+1.

    Within a token the channels are ordered ``(c, dy, dx)``, as ``FluxPipeline._pack_latents``.
    """
    b, c, h, w = latents.shape
    x = latents.reshape(b, c, h // 2, 2, w // 2, 2)  # [B, c, h/2, 2, w/2, 2]
    x = x.permute(0, 2, 4, 1, 3, 5)  # [B, h/2, w/2, c, 2, 2]
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_latents(packed: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Inverse of :func:`pack_latents`: ``[B, (h/2)·(w/2), 4c] → [B, c, h, w]``."""
    b, length, channels = packed.shape
    if length != (h // 2) * (w // 2) or channels % 4:
        raise G2RPOError(
            problem(
                "latents.shape",
                tuple(packed.shape),
                f"expected [B, {(h // 2) * (w // 2)}, 4c] for a {h}×{w} latent grid",
            )
        )
    x = packed.reshape(b, h // 2, w // 2, channels // 4, 2, 2)  # [B, h/2, w/2, c, 2, 2]
    x = x.permute(0, 3, 1, 4, 2, 5)  # [B, c, h/2, 2, w/2, 2]
    return x.reshape(b, channels // 4, h, w)


def image_ids(
    h: int, w: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Position ids ``[(h/2)·(w/2), 3]`` of the packed tokens: ``(0, i, j)`` in row-major order."""
    rows = torch.arange(h // 2).repeat_interleave(w // 2)  # [L]
    cols = torch.arange(w // 2).repeat(h // 2)  # [L]
    ids = torch.stack([torch.zeros_like(rows), rows, cols], dim=-1)  # [L, 3]
    return ids.to(device=device, dtype=dtype)


def text_ids(
    sequence_length: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Position ids ``[S, 3]`` of the text tokens: all zero (Flux gives text no rotary position)."""
    return torch.zeros(sequence_length, 3, device=device, dtype=dtype)


def initial_noise(
    generators: torch.Generator | Sequence[torch.Generator],
    height: int,
    width: int,
    *,
    batch_size: int | None = None,
    latent_channels: int = 16,
    vae_scale_factor: int = 8,
) -> torch.Tensor:
    """Packed standard normal noise ``[B, L, C]`` float32, drawn the way ``FluxPipeline`` draws it.

    The noise is drawn unpacked, ``[B, c, h, w]``, on the generator's device and then packed, so
    one generator seeded like the pipeline's gives the pipeline's noise. A list of generators draws
    one image each (``diffusers.utils.torch_utils.randn_tensor`` does the same); the trainer uses
    one generator per prompt, derived by :mod:`g2rpo.seeding`.
    """
    h, w = latent_grid(height, width, vae_scale_factor)
    if isinstance(generators, torch.Generator):
        b = 1 if batch_size is None else batch_size
        noise = torch.randn(
            (b, latent_channels, h, w), generator=generators, device=generators.device, dtype=torch.float32
        )
    else:
        gens = list(generators)
        if batch_size is not None and batch_size != len(gens):
            raise G2RPOError(problem("batch_size", batch_size, f"pass one generator per image ({len(gens)} given)"))
        noise = torch.cat(
            [torch.randn((1, latent_channels, h, w), generator=g, device=g.device, dtype=torch.float32) for g in gens]
        )
    return pack_latents(noise)


# --------------------------------------------------------------------------- timestep


def round_timestep(sigma: torch.Tensor, dtype: torch.dtype, mode: TimestepMode = "pipeline") -> torch.Tensor:
    """The timestep fed to the transformer for σ ``[B]``, in ``dtype`` (the transformer's).

    ``"pipeline"``: ``t = (σ·1000).to(dtype) / 1000`` (FluxPipeline's float32 ``σ·1000`` cast to
    the model dtype; in float32 this is ``σ·1000/1000``, which can differ from σ by one ulp — kept
    so the pipeline is reproduced bit for bit). ``"truncate"``: ``t = ⌊σ·1000⌋ / 1000`` in float64,
    then cast (the G²RPO reference code's ``int(σ·1000)/1000``; σ ≥ 0 so ⌊·⌋ is ``int``).
    ``"raw"``: σ cast to ``dtype`` (for σ already truncated by the strategy).
    """
    if mode == "pipeline":
        return (sigma.float() * 1000).to(dtype) / 1000
    if mode == "truncate":
        return (torch.floor(sigma.double() * 1000) / 1000).to(dtype)
    if mode == "raw":
        return sigma.to(dtype)
    raise G2RPOError(problem("timestep_mode", mode, f"use one of {', '.join(TIMESTEP_MODES)}"))


def timestep_mode_for(truncate_timestep: bool) -> TimestepMode:
    """The adapter's mode for a strategy config: ``"raw"`` when the strategy already truncates σ."""
    return "raw" if truncate_timestep else "pipeline"


# --------------------------------------------------------------------------- attention kernels


def avoid_cudnn_attention(device: torch.device) -> bool:
    """On CUDA, turn cuDNN's scaled-dot-product-attention kernel off for this process; True if it was on.

    Measured on an H200 (torch 2.11.0+cu130, cuDNN 9, 2026-12-04; benchmarks/results/gpu-h200/): the
    backward through FLUX.1-dev's blocks at 720² (2025 + 512 tokens, bf16) fails with
    CUBLAS_STATUS_EXECUTION_FAILED / "an illegal memory access" when PyTorch may choose cuDNN's attention
    (its default there, and cuDNN alone), and runs with flash attention or the memory-efficient kernel
    alone. Process-wide rather than a context around the forward: gradient checkpointing recomputes the
    blocks' forward inside ``backward()``, outside any such context. Flash attention (what the reference
    training code runs on) and the memory-efficient kernel stay allowed, and so does the math fallback.
    """
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


# --------------------------------------------------------------------------- velocity adapter


class FluxVelocity(nn.Module):
    """``FluxTransformer2DModel`` as the core's velocity model ``v(x, σ, cond)`` for one image size.

    ``x`` ``[B, L, C]`` float32 packed latents of ``height × width`` images, ``sigma`` ``[B]``
    (rows may sit at different σ), ``cond`` a :class:`FluxConditioning` of batch B. Returns the
    velocity ``[B, L, C]`` in float32. The wrapped transformer is ``self.transformer`` (what the
    optimiser trains and the exporter saves).
    """

    def __init__(
        self,
        transformer: nn.Module,
        *,
        height: int,
        width: int,
        vae_scale_factor: int = 8,
        guidance: float | None = DEFAULT_GUIDANCE,
        timestep_mode: TimestepMode = "pipeline",
        gradient_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        if timestep_mode not in TIMESTEP_MODES:
            raise G2RPOError(problem("timestep_mode", timestep_mode, f"use one of {', '.join(TIMESTEP_MODES)}"))
        config = transformer.config
        if config.guidance_embeds and guidance is None:
            raise G2RPOError(
                problem(
                    "guidance", guidance, "this transformer embeds a guidance scale (FLUX.1-dev): set one, e.g. 3.5"
                )
            )
        if not config.guidance_embeds and guidance is not None:
            raise G2RPOError(
                problem(
                    "guidance",
                    guidance,
                    "this transformer has no guidance embedding (e.g. FLUX.1-schnell): set guidance to null",
                )
            )
        self.transformer = transformer
        self.height, self.width = height, width
        self.grid = latent_grid(height, width, vae_scale_factor)  # (h, w) unpacked
        self.latent_shape = packed_shape(height, width, config.in_channels // 4, vae_scale_factor)  # (L, C)
        self.guidance = guidance
        self.timestep_mode: TimestepMode = timestep_mode
        self.set_gradient_checkpointing(gradient_checkpointing)
        self.register_buffer("img_ids", image_ids(*self.grid), persistent=False)  # [L, 3]

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        """Recompute each block's activations in backward (less memory, ~1 more forward)."""
        if enabled:
            self.transformer.enable_gradient_checkpointing()
        else:
            self.transformer.disable_gradient_checkpointing()

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: FluxConditioning) -> torch.Tensor:
        b, length, channels = x.shape
        if (length, channels) != tuple(self.latent_shape):
            raise G2RPOError(
                problem(
                    "x.shape",
                    tuple(x.shape),
                    f"expected [B, {self.latent_shape[0]}, {self.latent_shape[1]}] for {self.height}×{self.width} images",
                )
            )
        if sigma.shape != (b,):
            raise G2RPOError(problem("sigma.shape", tuple(sigma.shape), f"pass one σ per row: shape [{b}]"))
        if len(cond) != b:
            raise G2RPOError(problem("len(cond)", len(cond), f"conditioning must have one row per latent ({b})"))
        dtype = self.dtype
        device = x.device
        guidance = None
        if self.guidance is not None:
            guidance = torch.full((b,), float(self.guidance), device=device, dtype=torch.float32)
        v = self.transformer(
            hidden_states=x.to(dtype),
            timestep=round_timestep(sigma.to(device), dtype, self.timestep_mode),
            guidance=guidance,
            pooled_projections=cond.pooled_prompt_embeds.to(device=device, dtype=dtype),
            encoder_hidden_states=cond.prompt_embeds.to(device=device, dtype=dtype),
            txt_ids=text_ids(cond.sequence_length, device=device, dtype=dtype),
            img_ids=self.img_ids.to(device=device, dtype=dtype),
            return_dict=False,
        )[0]  # [B, L, C] in the model dtype
        return v.float()

    @torch.no_grad()
    def reference_velocity(self, x: torch.Tensor, sigma: torch.Tensor, cond: FluxConditioning) -> torch.Tensor:
        """The reference policy's velocity (a KL penalty's π_ref): the base model, LoRA adapters disabled.

        Only a LoRA run has its base at hand; training the full weights leaves no reference here."""
        if not getattr(self.transformer, "_hf_peft_config_loaded", False):
            raise G2RPOError(
                problem(
                    "train.lora.enabled",
                    False,
                    "a KL penalty to the reference policy needs LoRA (the reference is the base with adapters "
                    "disabled): set train.lora.enabled=true, or the strategy's kl_beta: 0",
                )
            )
        self.transformer.disable_adapters()
        try:
            return self.forward(x, sigma, cond)
        finally:
            self.transformer.enable_adapters()


# --------------------------------------------------------------------------- text encoding


class FluxTextEncoder:
    """Prompts → :class:`FluxConditioning`, exactly as ``FluxPipeline.encode_prompt`` computes them.

    CLIP (``tokenizer``/``text_encoder``) gives the pooled embedding of its ``model_max_length``
    (77) padded tokens; T5 (``tokenizer_2``/``text_encoder_2``) gives the last hidden state of
    ``max_sequence_length`` padded tokens (default: the T5 tokenizer's ``model_max_length``, at
    most 512 — 512 for FLUX.1-dev). Longer prompts are truncated, as in the pipeline.
    """

    def __init__(
        self,
        tokenizer: Any,
        text_encoder: nn.Module,
        tokenizer_2: Any,
        text_encoder_2: nn.Module,
        max_sequence_length: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.text_encoder = text_encoder
        self.tokenizer_2 = tokenizer_2
        self.text_encoder_2 = text_encoder_2
        limit = min(int(tokenizer_2.model_max_length), 512)
        if max_sequence_length is None:
            max_sequence_length = limit
        if not 1 <= max_sequence_length <= 512:
            raise G2RPOError(problem("max_sequence_length", max_sequence_length, "use 1..512 (FLUX.1-dev: 512)"))
        self.max_sequence_length = int(max_sequence_length)
        self._truncation_announced: set[str] = set()  # tokenizers whose cut was already announced

    @classmethod
    def from_pipeline(cls, pipe: Any, max_sequence_length: int | None = None) -> FluxTextEncoder:
        return cls(pipe.tokenizer, pipe.text_encoder, pipe.tokenizer_2, pipe.text_encoder_2, max_sequence_length)

    @property
    def device(self) -> torch.device:
        return next(self.text_encoder_2.parameters()).device

    def _announce_truncation(self, prompts: list[str]) -> None:
        """Say once per encoder and tokenizer, with the numbers, that prompts are cut to its limit (as
        diffusers' FluxPipeline cuts them): a cut prompt asks for less than its text says."""
        warned = self._truncation_announced
        for name, tokenizer, limit, fix in (
            ("CLIP", self.tokenizer, self.tokenizer.model_max_length, "shorten them (CLIP reads 77 tokens)"),
            ("T5", self.tokenizer_2, self.max_sequence_length, "raise data.max_sequence_length (at most 512)"),
        ):
            if name in warned:
                continue
            lengths = [len(ids) for ids in tokenizer(prompts, truncation=False).input_ids]
            over = [n for n in lengths if n > limit]
            if over:
                warned.add(name)
                _log.warning(
                    "%d of %d prompts exceed the %s tokenizer's %d tokens (longest %d) and are cut there; %s",
                    len(over),
                    len(prompts),
                    name,
                    limit,
                    max(over),
                    fix,
                )

    @torch.no_grad()
    def encode(self, prompts: Sequence[str]) -> FluxConditioning:
        prompts = list(prompts)
        self._announce_truncation(prompts)
        clip_ids = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids  # [B, 77]
        clip_device = next(self.text_encoder.parameters()).device
        pooled = self.text_encoder(clip_ids.to(clip_device), output_hidden_states=False).pooler_output  # [B, P]
        t5_ids = self.tokenizer_2(
            prompts,
            padding="max_length",
            max_length=self.max_sequence_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids  # [B, S]
        t5_device = next(self.text_encoder_2.parameters()).device
        seq = self.text_encoder_2(t5_ids.to(t5_device), output_hidden_states=False)[0]  # [B, S, D]
        return FluxConditioning(seq.to(self.text_encoder_2.dtype), pooled.to(self.text_encoder.dtype))


# --------------------------------------------------------------------------- decoding


def vae_scale_factor_of(vae: nn.Module) -> int:
    """Spatial downsampling of an ``AutoencoderKL``: ``2^(blocks − 1)`` (8 for Flux's VAE)."""
    return 2 ** (len(vae.config.block_out_channels) - 1)


@torch.no_grad()
def decode_latents(
    vae: nn.Module,
    latents: torch.Tensor,
    height: int,
    width: int,
    *,
    micro_batch: int = 16,
) -> torch.Tensor:
    """Packed latents ``[B, L, C]`` → images ``[B, 3, H, W]`` float32 in [0, 1].

    ``z = latents / scaling_factor + shift_factor`` (Flux's VAE: 0.3611, 0.1159), decoded in
    micro-batches of ``micro_batch`` images in the VAE's dtype, then ``(y + 1) / 2`` clamped to
    [0, 1] (``VaeImageProcessor.denormalize``). No gradient flows (rewards score, they are not
    back-propagated in GRPO). The default ``micro_batch`` (``train.decode_micro_batch``'s) comes
    from ``benchmarks/decode.py``: time per image against images per call, and the decode memory
    per image at FLUX.1-dev size.
    """
    if micro_batch < 1:
        raise G2RPOError(problem("micro_batch", micro_batch, "decode at least one image at a time"))
    factor = vae_scale_factor_of(vae)
    h, w = latent_grid(height, width, factor)
    z = unpack_latents(latents.float(), h, w)  # [B, c, h, w]
    z = z / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
    param = next(vae.parameters())
    images = []
    for start in range(0, z.shape[0], micro_batch):
        chunk = z[start : start + micro_batch].to(device=param.device, dtype=param.dtype)
        decoded = vae.decode(chunk, return_dict=False)[0]  # [b, 3, H, W] in about [-1, 1]
        images.append((decoded.float() / 2 + 0.5).clamp(0, 1))
    return torch.cat(images).to(latents.device)
