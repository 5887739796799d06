"""One strict reader for the text files a user hands g2rpo: prompts, configs, gates.

:func:`read_text_file` accepts only a regular file (a directory, FIFO or device is refused by what it
is, before it is opened, so a FIFO never blocks), at most ``max_bytes`` long, decoded as UTF-8
without a NUL byte (a UTF-8 BOM is dropped). Anything else is refused naming the file, the line and
the fix: a UTF-16 file (with or without its BOM) shows up as NUL bytes or as a BOM and is named as
such; a stray byte of another encoding is named with its line and column.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from g2rpo.errors import G2RPOError

__all__ = ["read_text_file", "decode_text", "describe_kind"]

_SAVE_AS = "save it as UTF-8 text (e.g. `iconv -f UTF-16 -t UTF-8 FILE > NEW`)"


def describe_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _line_col(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def decode_text(data: bytes, where: str) -> str:
    """``data`` as UTF-8 text (BOM dropped), or a G2RPOError naming ``where``, the line and the fix."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise G2RPOError(f"{where} is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8: {_SAVE_AS}")
    nul = data.find(b"\0")
    if nul >= 0:
        line, col = _line_col(data, nul)
        hint = (
            "UTF-16 text without a byte-order mark"
            if data[1::2].count(0) > len(data) // 4 or data[0::2].count(0) > len(data) // 4
            else "a binary file"
        )
        raise G2RPOError(
            f"{where}: line {line}, column {col} holds a NUL byte, which text never does; it looks like {hint}: "
            f"{_SAVE_AS}, or pass the intended file"
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        raise G2RPOError(
            f"{where}: line {line}, column {col}: byte 0x{data[exc.start]:02x} is not UTF-8 ({exc.reason}): {_SAVE_AS}"
        ) from None


def read_text_file(path: str | Path, *, what: str, max_bytes: int | None = None) -> str:
    """The text of ``path`` (see the module docstring); ``what`` names the file in errors ("prompt file")."""
    path = Path(path)
    where = f"{what} {str(path)!r}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise G2RPOError(
            f"{where} does not exist: check the path (a relative path is taken from {str(Path.cwd())!r})"
        ) from None
    except OSError as exc:
        raise G2RPOError(f"{where} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise G2RPOError(f"{where} is {describe_kind(info.st_mode)}, not a text file: pass the file itself")
    if max_bytes is not None and info.st_size > max_bytes:
        raise G2RPOError(
            f"{where} is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit for a {what}: "
            "pass the intended file (a config or prompt list is far smaller)"
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    except OSError as exc:
        raise G2RPOError(f"{where} cannot be read: {exc.strerror}") from None
    if max_bytes is not None and len(data) > max_bytes:  # grew since the stat
        raise G2RPOError(f"{where} is over the {max_bytes:,}-byte limit for a {what}: pass the intended file")
    return decode_text(data, where)
