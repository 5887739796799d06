"""Kubernetes resource quantities, checked before anything is sent to a cluster.

A pod's CPU and memory limits and an emptyDir's ``sizeLimit`` are quantities (Kubernetes'
``resource.Quantity``): a number, then at most one suffix — a binary one (``Ki Mi Gi Ti Pi Ei``), a
decimal one (``n u m k M G T P E``, or none) or a decimal exponent (``e3``, ``E-2``). The API server
refuses anything else, but only when it creates the pod: a run would be accepted and then fail on
the cluster. So ``g2rpo pipeline submit`` and the train task parse them first.

Beyond the grammar, two slips are caught because they are valid quantities that no training pod
can mean: a memory size written with ``m`` (milli: ``1600m`` is 1.6 bytes; ``M`` or ``Mi`` was
meant) and any size below :data:`MIN_MEMORY_BYTES`. CPU must be positive.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Literal

from g2rpo.errors import problem

__all__ = ["MIN_MEMORY_BYTES", "quantity_problem", "quantity_value"]

# Kubernetes' grammar: <sign><digits>[.<digits>]<suffix>, the suffix binary, decimal or an exponent.
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
MIN_MEMORY_BYTES = 2**20  # a memory limit or /dev/shm below 1 MiB is a unit slip, never a setting

Kind = Literal["cpu", "memory"]
_EXAMPLES = {"cpu": "e.g. '96' (cores) or '500m' (half a core)", "memory": "e.g. '1600Gi' or '64Gi' (Ki, Mi, Gi, Ti)"}


def quantity_value(text: str) -> Decimal | None:
    """The quantity ``text`` as a number (bytes or cores), or None when it is not a Kubernetes quantity."""
    match = _QUANTITY.match(text)
    if match is None:
        return None
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number.scaleb(_DECIMAL[suffix])
    return number.scaleb(int(suffix[1:]))


def _suggestion(text: str, kind: Kind) -> str:
    """A guess at what was meant: '1600GB' -> '1600G or 1600Gi', '96 cores' -> '96'."""
    squeezed = re.sub(r"\s+", "", text)
    if kind == "memory":
        match = re.match(r"^(\d+(?:\.\d+)?)([KMGTPE])i?B$", squeezed, re.IGNORECASE)
        if match:
            number, unit = match.group(1), match.group(2).upper().replace("K", "k")
            binary = unit.replace("k", "K") + "i"
            return f" (did you mean {number}{binary}, or {number}{unit} in powers of 1000?)"
    else:
        match = re.match(r"^(\d+(?:\.\d+)?)(cores?|cpus?|vcpus?)$", squeezed, re.IGNORECASE)
        if match:
            return f" (did you mean {match.group(1)!r}?)"
    return ""


def quantity_problem(field: str, value: object, kind: Kind) -> str | None:
    """What is wrong with ``value`` as the ``kind`` quantity of ``field`` (``field=value: fix``), or None."""
    text = value if isinstance(value, str) else None
    amount = quantity_value(text.strip()) if text is not None and text.strip() == text else None
    if amount is None:
        hint = _suggestion(text, kind) if text is not None else ""
        return problem(
            field,
            value,
            f"not a Kubernetes quantity{hint}: give a number with at most one unit suffix, {_EXAMPLES[kind]}",
        )
    if amount <= 0:
        return problem(field, value, f"give a positive quantity, {_EXAMPLES[kind]}")
    if kind == "memory" and amount < MIN_MEMORY_BYTES:
        slip = (
            f" ('m' is milli: {value} is {amount.normalize():f} bytes; did you mean {value[:-1]}Mi?)"
            if value.endswith("m")
            else f" ({amount.normalize():f} bytes)"
        )
        return problem(field, value, f"smaller than 1Mi, too small for any pod{slip}: {_EXAMPLES[kind]}")
    return None
