"""Prompts longer than a text encoder's limit are cut as FluxPipeline cuts them — and said so once, with
the numbers (issue 30: limits applied without a word)."""

from __future__ import annotations

import logging

from g2rpo.models.flux import FluxTextEncoder
from g2rpo.models.tiny import build_tiny_flux_pipeline


def test_a_cut_prompt_is_announced_once_with_the_numbers(caplog):
    encoder = FluxTextEncoder.from_pipeline(build_tiny_flux_pipeline(0), max_sequence_length=16)
    short, long = "a red circle", " ".join(["red"] * 40)
    with caplog.at_level(logging.WARNING, logger="g2rpo.models.flux"):
        encoder.encode([short])
        assert not caplog.records  # nothing cut, nothing said
        encoder.encode([short, long])
        encoder.encode([long])  # the same tokenizer again: already said
    t5 = [r.getMessage() for r in caplog.records if "T5" in r.getMessage()]
    assert len(t5) == 1, [r.getMessage() for r in caplog.records]
    assert t5[0].startswith("1 of 2 prompts exceed the T5 tokenizer's 16 tokens (longest ")
    assert "data.max_sequence_length" in t5[0]
