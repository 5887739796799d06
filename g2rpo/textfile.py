"""One strict reader for the text files g2rpo reads: prompts, configs, gates, and the JSON records it
wrote itself and reads back (claims, checkpoint state, registry records, eval and task reports).

:func:`read_text_file` accepts only a regular file (a directory, FIFO or device is refused by what it
is, before it is opened, so a FIFO never blocks), at most ``max_bytes`` long, decoded as UTF-8
without a NUL byte (a UTF-8 BOM is dropped). Anything else is refused naming the file, the line and
the fix: a UTF-16 file (with or without its BOM) shows up as NUL bytes or as a BOM and is named as
such; a stray byte of another encoding is named with its line and column.

:func:`read_json_file` (a file) and :func:`decode_json` (bytes, e.g. from S3) add the JSON checks:
an empty document, a syntax error (line and column, and "it ends early" for a truncated write) and a
top-level value of the wrong type (a list where an object belongs) are each refused naming the file
and the caller's fix ("re-run the eval", "republish it").
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from g2rpo.errors import G2RPOError

__all__ = [
    "JSON_MAX_BYTES",
    "RECORD_MAX_BYTES",
    "read_regular_file",
    "read_text_file",
    "read_json_file",
    "decode_text",
    "decode_json",
    "decode_record",
    "describe_kind",
]

_SAVE_AS = "save it as UTF-8 text (e.g. `iconv -f UTF-16 -t UTF-8 FILE > NEW`)"

# The JSON documents g2rpo writes and reads back. The largest is an eval's scores.json: IMAGES_MAX =
# 100,000 images at ~300 bytes a row is ~30 MB; anything far past that is not one of ours.
JSON_MAX_BYTES = 128 * 1024 * 1024
# A claim, marker or state record (writer claim, run marker, publish claim, trainer_state.json) is a few
# hundred bytes.
RECORD_MAX_BYTES = 64 * 1024

_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}


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


def decode_text(data: bytes, where: str, fix: str = _SAVE_AS) -> str:
    """``data`` as UTF-8 text (BOM dropped), or a G2RPOError naming ``where``, the line and ``fix``."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise G2RPOError(f"{where} is UTF-16 (it starts with a UTF-16 byte-order mark), not UTF-8: {fix}")
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
            f"{fix}" + (", or pass the intended file" if fix == _SAVE_AS else "")
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line, col = _line_col(data, exc.start)
        raise G2RPOError(
            f"{where}: line {line}, column {col}: byte 0x{data[exc.start]:02x} is not UTF-8 ({exc.reason}): {fix}"
        ) from None


def read_regular_file(path: str | Path, *, what: str, max_bytes: int | None = None, fix: str = _SAVE_AS) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes``; ``what`` names it in errors."""
    path = Path(path)
    where = f"{what} {str(path)!r}"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise G2RPOError(
            f"{where} does not exist: "
            + (f"check the path (a relative path is taken from {str(Path.cwd())!r})" if fix == _SAVE_AS else fix)
        ) from None
    except OSError as exc:
        raise G2RPOError(f"{where} cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "text" if fix == _SAVE_AS else "regular"
        raise G2RPOError(
            f"{where} is {describe_kind(info.st_mode)}, not a {kind} file: "
            + ("pass the file itself" if fix == _SAVE_AS else fix)
        )
    if max_bytes is not None and info.st_size > max_bytes:
        raise G2RPOError(
            f"{where} is {info.st_size:,} bytes, over the {max_bytes:,}-byte limit for a {what}: "
            + ("pass the intended file (a config or prompt list is far smaller)" if fix == _SAVE_AS else fix)
        )
    try:
        with open(path, "rb") as handle:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    except OSError as exc:
        raise G2RPOError(f"{where} cannot be read: {exc.strerror}") from None
    if max_bytes is not None and len(data) > max_bytes:  # grew since the stat
        raise G2RPOError(f"{where} is over the {max_bytes:,}-byte limit for a {what}: pass the intended file")
    return data


def read_text_file(path: str | Path, *, what: str, max_bytes: int | None = None, fix: str = _SAVE_AS) -> str:
    """The text of ``path`` (see the module docstring); ``what`` names the file in errors ("prompt file"),
    ``fix`` is what to do about a file that is not UTF-8 text or is too large."""
    data = read_regular_file(path, what=what, max_bytes=max_bytes, fix=fix)
    return decode_text(data, f"{what} {str(path)!r}", fix)


def decode_json(data: bytes, where: str, *, fix: str, expect: type = dict) -> Any:
    """``data`` parsed as one JSON document of type ``expect`` (an object unless told), or a G2RPOError
    naming ``where``, what is wrong with it and ``fix``. Bytes that are not UTF-8 text (NUL bytes,
    UTF-16) are refused as :func:`decode_text` refuses them; NaN and Infinity are read as Python
    writes them."""
    text = decode_text(data, where, fix)
    if not text.strip():
        raise G2RPOError(f"{where} is empty (a write cut short, or the file was emptied): {fix}")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        ends_early = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        cut = " — it ends early, like a write cut short" if ends_early else ""
        raise G2RPOError(
            f"{where}: line {exc.lineno}, column {exc.colno}: not valid JSON ({exc.msg}){cut}: {fix}"
        ) from None
    if not isinstance(value, expect) or (expect is not bool and isinstance(value, bool)):
        found = "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
        raise G2RPOError(f"{where} holds {found} where {_JSON_TYPES.get(expect, expect.__name__)} belongs: {fix}")
    return value


def read_json_file(
    path: str | Path, *, what: str, fix: str, max_bytes: int = JSON_MAX_BYTES, expect: type = dict
) -> Any:
    """The JSON document in ``path``: a regular file of at most ``max_bytes``, UTF-8, one value of type
    ``expect``; anything else is a G2RPOError naming ``what`` and the path, what is wrong, and ``fix``."""
    data = read_regular_file(path, what=what, max_bytes=max_bytes, fix=fix)
    return decode_json(data, f"{what} {str(path)!r}", fix=fix, expect=expect)


def decode_record(cls: Any, data: bytes, where: str, *, fix: str) -> Any:
    """``data`` as an instance of ``cls``, a pydantic model: :func:`decode_json`'s checks, then the model's
    own, the first failing field named (``items.0.seed: Input should be a valid integer``) with ``fix``."""
    decode_json(data, where, fix=fix)
    try:
        return cls.model_validate_json(data)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = getattr(exc, "errors", None)
        first = errors()[0] if callable(errors) and errors() else None
        detail = str(exc) if first is None else f"{'.'.join(map(str, first['loc'])) or 'the document'}: {first['msg']}"
        raise G2RPOError(f"{where} is not a valid {cls.__name__} ({detail}): {fix}") from None
