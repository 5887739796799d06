"""A complete tiny ``FluxPipeline`` of the real classes, built offline with seeded random weights.

Tests and the demo load it through the same ``from_pretrained(local_dir, local_files_only=True)``
path as FLUX.1-dev, so every code path but the sizes is the production one:

| component | class | tiny size (FLUX.1-dev) |
| --- | --- | --- |
| transformer | ``FluxTransformer2DModel`` | 2 + 2 blocks, 2 heads × 16, ~135k params (19 + 38 blocks, 24 × 128, 11.9B) |
| vae | ``AutoencoderKL`` | 4 blocks (8, 8, 16, 16), 16 latent channels: keeps the 8× factor (4 × (128 … 512)) |
| text_encoder | ``CLIPTextModel`` | hidden 32, 2 layers (768, 12) |
| text_encoder_2 | ``T5EncoderModel`` | d_model 32, 2 layers (4096, 24) |
| tokenizer | ``CLIPTokenizer`` | open_clip's BPE, first 1000 merges (all 48,894) |
| tokenizer_2 | ``T5TokenizerFast`` | a ~200-piece unigram vocab, max length 32 (32k pieces, 512) |
| scheduler | ``FlowMatchEulerDiscreteScheduler`` | FLUX.1-dev's config (dynamic shift 0.5 → 1.15) |

Sizes were measured to work with diffusers' Flux classes: the RoPE axes (4, 6, 6) are even and sum
to the head dimension 16; joint/pooled projection dims equal the text encoders' widths.

Tokenizers are built in memory and saved (nothing is downloaded). The CLIP vocabulary is the one
open_clip ships (``bpe_simple_vocab_16e6.txt.gz``): 256 byte symbols, the same with ``</w>``, the
first N merges and the two special tokens, in open_clip's order, so ids agree with open_clip's
tokenizer for text covered by those merges. The T5 vocabulary is ASCII characters, ``▁``-prefixed
characters and a few common words, so any ASCII prompt tokenizes (other characters map to
``<unk>``).

The VAE uses FLUX.1-dev's ``scaling_factor`` 0.3611 and ``shift_factor`` 0.1159 so decoding runs
the same arithmetic. Weights are the classes' own initialisation under ``torch.manual_seed(seed)``
per component: the same seed gives the same weights on every machine.
"""

from __future__ import annotations

import gzip
import json
import shutil
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from g2rpo.artifacts.ownership import check_replaceable
from g2rpo.artifacts.storage import check_writable
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import RECORD_MAX_BYTES, read_json_file

__all__ = [
    "TINY_IMAGE_SIZE",
    "TINY_MARKER",
    "build_tiny_flux_pipeline",
    "save_tiny_flux",
    "tiny_clip_tokenizer",
    "tiny_t5_tokenizer",
]

TINY_IMAGE_SIZE = 64  # 64×64 images → 8×8 latents → 16 packed tokens
TINY_T5_MAX_LENGTH = 32
TINY_CLIP_MAX_LENGTH = 77
TINY_CLIP_MERGES = 1000
TINY_MARKER = "g2rpo_tiny.json"  # written next to model_index.json: what made this directory
# What a g2rpo model folder holds at its top level (diffusers' save_pretrained, the marker, the manifest):
# --overwrite replaces only a folder of these entries with a g2rpo marker (g2rpo.artifacts.ownership).
MODEL_ENTRIES = (
    "model_index.json",
    "transformer",
    "vae",
    "text_encoder",
    "text_encoder_2",
    "tokenizer",
    "tokenizer_2",
    "scheduler",
    TINY_MARKER,
    "manifest.json",
)


def g2rpo_model_marker_problem(folder: Path) -> str | None:
    """None when ``folder`` carries a g2rpo model marker (tiny or shapes), else what is wrong with it."""
    marker = folder / TINY_MARKER
    if not marker.exists():
        return f"no {TINY_MARKER}, the marker g2rpo writes in every model folder it makes"
    try:
        fix = "g2rpo writes it whole, so it is not g2rpo's or was changed since"
        producer = read_json_file(marker, what="model marker", fix=fix, max_bytes=RECORD_MAX_BYTES).get("producer", "")
    except G2RPOError as exc:
        return str(exc)
    if not str(producer).startswith("g2rpo.models."):
        return f"its {TINY_MARKER} names producer {producer!r}, not a g2rpo model"
    return None


def check_model_overwrite(folder: Path, field: str = "output") -> None:
    """Refuse ``--overwrite`` of a folder that is not a g2rpo model folder (naming what it holds)."""

    check_replaceable(
        folder, field=field, kind="g2rpo model folder", own=MODEL_ENTRIES, is_ours=g2rpo_model_marker_problem
    )


_T5_WORDS = (
    "a an the of and in on with at to for from by is are photo picture painting portrait of cat dog "
    "man woman girl boy city street house tree forest mountain river sea sky sun moon night day red "
    "green blue yellow black white small large old young beautiful cute detailed style art digital "
    "oil light dark car bird flower garden room table chair window water fire snow rain"
).split()


def tiny_clip_tokenizer(num_merges: int = TINY_CLIP_MERGES, model_max_length: int = TINY_CLIP_MAX_LENGTH) -> Any:
    """A ``CLIPTokenizer`` on the first ``num_merges`` merges of open_clip's bundled BPE vocabulary.

    transformers 5 needs ``vocab=dict, merges=list of pairs`` (``vocab_file=`` is ignored there and yields a
    2-token vocabulary).
    """
    import open_clip.tokenizer as oc_tok
    from transformers import CLIPTokenizer

    with gzip.open(oc_tok.default_bpe(), "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 1 + num_merges]]  # line 0 is a version header
    symbols = list(oc_tok.bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=model_max_length)


def tiny_t5_tokenizer(model_max_length: int = TINY_T5_MAX_LENGTH, extra_words: Sequence[str] = ()) -> Any:
    """A ``T5TokenizerFast`` (unigram) over ASCII characters and a few words (and ``extra_words``, one
    token each); ``<pad>``=0, ``</s>``=1, ``<unk>``=2."""
    from transformers import T5TokenizerFast

    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    chars = [c for c in string.printable if not c.isspace()]
    pieces += [(c, -5.0) for c in chars]
    pieces += [("▁" + c, -4.5) for c in chars]
    # Whole words score higher than their characters, so common words become one token.
    pieces += [("▁" + w, -2.0) for w in dict.fromkeys([*_T5_WORDS, *extra_words])]
    return T5TokenizerFast(vocab=pieces, extra_ids=0, model_max_length=model_max_length)


def flux_dev_scheduler() -> Any:
    """``FlowMatchEulerDiscreteScheduler`` with FLUX.1-dev's configuration (dynamic shift 0.5 → 1.15)."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )


def build_tiny_flux_pipeline(seed: int = 0, extra_words: Sequence[str] = (), num_attention_heads: int = 2) -> Any:
    """The tiny ``FluxPipeline`` in memory (float32, CPU), weights seeded by ``seed``.

    ``extra_words`` become single T5 tokens (a task's vocabulary); ``num_attention_heads`` × 16 is
    the transformer's width."""
    import torch
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    tokenizer = tiny_clip_tokenizer()
    tokenizer_2 = tiny_t5_tokenizer(extra_words=extra_words)

    torch.manual_seed(seed)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            max_position_embeddings=TINY_CLIP_MAX_LENGTH,
            projection_dim=32,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    torch.manual_seed(seed + 1)
    text_encoder_2 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer_2),
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=32,
            feed_forward_proj="gated-gelu",  # T5 v1.1, as FLUX.1-dev's T5-XXL
            pad_token_id=0,
            eos_token_id=1,
            is_encoder_decoder=False,
            use_cache=False,
        )
    )
    torch.manual_seed(seed + 2)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=2,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=num_attention_heads,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=True,
        axes_dims_rope=(4, 6, 6),
    )
    torch.manual_seed(seed + 3)
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=16,
        norm_num_groups=4,
        sample_size=TINY_IMAGE_SIZE,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    return FluxPipeline(
        scheduler=flux_dev_scheduler(),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )


def save_tiny_flux(output: str | Path, seed: int = 0, overwrite: bool = False) -> Path:
    """Build the tiny pipeline and ``save_pretrained`` it to ``output`` (safetensors).

    Refuses a non-empty ``output`` unless ``overwrite``, which replaces it only when it is a g2rpo
    model folder (:func:`check_model_overwrite`): nothing a user put there is lost. Writes ``g2rpo_tiny.json`` (seed, sizes, licence) last.
    """
    out = Path(output)
    check_writable(out, "output")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise G2RPOError(
            problem(
                "output", str(out), "directory is not empty; choose a new directory or pass --overwrite to replace it"
            )
        )
    if overwrite:
        check_model_overwrite(out)
        # the old model goes whole: stale subfolders and an old manifest would not match the new weights
        if out.is_dir() and any(out.iterdir()):
            shutil.rmtree(out)
    pipe = build_tiny_flux_pipeline(seed)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out, safe_serialization=True)
    marker = {
        "producer": "g2rpo.models.tiny.save_tiny_flux",
        "seed": seed,
        "image_size": TINY_IMAGE_SIZE,
        "max_sequence_length": TINY_T5_MAX_LENGTH,
        "transformer_parameters": sum(p.numel() for p in pipe.transformer.parameters()),
        "licence": "random weights made by g2rpo (Apache-2.0); not derived from FLUX.1-dev",
    }
    (out / TINY_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out
