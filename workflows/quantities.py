"""Kubernetes resource quantities, canonicalised so that equal amounts compare equal.

``250m`` and ``0.25`` CPU are the same amount, and so are ``1Gi`` and ``1024Mi`` of memory.
The canonical form is the plain decimal number of base units (cores, bytes) with no exponent
and no trailing zeros: ``canonical_quantity("250m") == "0.25"``,
``canonical_quantity("1Gi") == "1073741824"``.
"""

from __future__ import annotations

import re
from decimal import Decimal

_SUFFIXES = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_QUANTITY = re.compile(
    r"^(?P<num>\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


MAX_QUANTITY_LENGTH = 64
MAX_QUANTITY = Decimal(2) ** 63  # base units: far beyond any node (8 EiB, 9.2e18 cores)


def parse_quantity(text: str) -> Decimal:
    """The amount in base units. Raises ``ValueError`` (only) on anything Kubernetes would
    reject, and on amounts no node could have (over ``MAX_QUANTITY``), so that a hostile value
    such as ``1e1000000`` is a bad input, never an arithmetic error deep in the engine."""
    if not isinstance(text, str) or len(text) > MAX_QUANTITY_LENGTH:
        raise ValueError(f"invalid resource quantity {str(text)[:MAX_QUANTITY_LENGTH]!r}")
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"invalid resource quantity {text!r}")
    exponent = int(match["exp"][1:]) if match["exp"] else 0
    if abs(exponent) > 30:  # decides before any arithmetic: 10**1000000 is never computed
        raise ValueError(f"resource quantity {text!r} is out of range")
    try:
        number = Decimal(match["num"])
        amount = number * (
            Decimal(10) ** exponent if match["exp"] else _SUFFIXES[match["suffix"] or ""]
        )
    except ArithmeticError as exc:  # decimal's InvalidOperation, Overflow, ...
        raise ValueError(f"invalid resource quantity {text!r}") from exc
    if amount > MAX_QUANTITY:
        raise ValueError(f"resource quantity {text!r} is out of range")
    return amount


def positive(quantity: object) -> bool:
    """Whether ``quantity`` (a limit as a pod carries it, or None) is set and above zero: a CPU
    quota, a memory limit."""
    return quantity is not None and parse_quantity(str(quantity)) > 0


def format_decimal(amount: Decimal) -> str:
    """Plain notation without exponent or trailing zeros (``Decimal('1E+3')`` -> ``'1000'``)."""
    text = format(amount.normalize(), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def canonical_quantity(text: str) -> str:
    return format_decimal(parse_quantity(text))
