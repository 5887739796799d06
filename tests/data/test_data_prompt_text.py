"""Prompt files are checked as text: a NUL byte or UTF-16 (with or without a BOM) is refused with the
line named, and a directory or FIFO is named as what it is (a FIFO is never opened)."""

from __future__ import annotations

import os

import pytest

from g2rpo.data import read_prompt_file
from g2rpo.errors import G2RPOError


def test_nul_bytes_and_utf16_are_refused_with_the_line(tmp_path):
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"a red circle\nblue\0square\n")
    with pytest.raises(G2RPOError, match=r"line 2, column 5 holds a NUL byte.*binary file"):
        read_prompt_file(nul)
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("a red circle\na blue square\n".encode("utf-16-le"))  # no BOM
    with pytest.raises(G2RPOError, match=r"NUL byte.*UTF-16 text without a byte-order mark"):
        read_prompt_file(utf16)
    bom = tmp_path / "bom.txt"
    bom.write_bytes("a red circle\n".encode("utf-16"))
    with pytest.raises(G2RPOError, match="is UTF-16"):
        read_prompt_file(bom)


def test_a_directory_or_fifo_is_named_as_such(tmp_path):
    with pytest.raises(G2RPOError, match="is a directory, not a prompt file"):
        read_prompt_file(tmp_path)
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    with pytest.raises(G2RPOError, match=r"is a FIFO \(named pipe\), not a prompt file"):
        read_prompt_file(fifo)
    with pytest.raises(G2RPOError, match="file not found"):
        read_prompt_file(tmp_path / "missing.txt")
