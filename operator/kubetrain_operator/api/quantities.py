"""Kubernetes quantities (500m, 8Gi, 1e3): their syntax, their value, and the CEL that checks and compares
them, for the resource requests and limits, volume sizes and divisors the spec takes.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated

from pydantic import AfterValidator, Field

from kubetrain_operator.api import base

QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A non-negative Kubernetes resource.Quantity (the syntax controller-gen emits for quantities, without the
minus sign: no resource, size or divisor the spec takes may be negative)."""


QUANTITY_MESSAGE = (
    "must be a non-negative quantity such as 2, 500m, 1.5 or 8Gi: digits with an optional fraction and "
    "one unit suffix (m, k, M, G, Ki, Mi, Gi ...), no spaces"
)
QUANTITY_RULE = base.cel_rule(
    "type(self) == int || (isQuantity(self) && !self.startsWith('-'))", QUANTITY_MESSAGE
)
"""How the CRD checks a quantity's string form: a rule, so that the message says what a quantity looks
like (a pattern's error would quote QUANTITY_PATTERN at the user)."""


def check_quantity(value: str) -> str:
    if not re.match(QUANTITY_PATTERN, value):
        raise ValueError(f"{value!r} {QUANTITY_MESSAGE}")
    return value


Quantity = Annotated[
    Annotated[int, Field(ge=0)] | Annotated[str, Field(max_length=64), AfterValidator(check_quantity)],
    Field(json_schema_extra={"x-kubetrain-quantity": True}),
]
"""A non-negative quantity: an integer, or a string in Kubernetes quantity syntax (500m, 8Gi, 1e3)."""

_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def quantity_value(value: int | str) -> Decimal:
    """The number a quantity stands for (500m -> 0.5, 1Ki -> 1024), to compare requests with limits as
    the API server does. Raises ValueError for anything QUANTITY_PATTERN refuses."""
    text = check_quantity(str(value))
    number = re.match(r"^\+?([0-9]*\.?[0-9]*)", text)
    assert number is not None  # the pattern above guarantees a leading number
    digits, suffix = number.group(1), text[number.end() :]
    if suffix in _BINARY_SUFFIXES:
        return Decimal(digits) * _BINARY_SUFFIXES[suffix]
    if suffix in _DECIMAL_SUFFIXES:
        return Decimal(digits).scaleb(_DECIMAL_SUFFIXES[suffix])
    return Decimal(digits).scaleb(int(suffix[1:]))


def cel_quantity(expr: str) -> str:
    return f"quantity(string({expr}))"


def cel_is_quantity(expr: str) -> str:
    """Guards every quantity() call: a string QUANTITY_RULE refuses must not also fail a rule with an
    evaluation error (QUANTITY_RULE's own error already names the field)."""
    return f"isQuantity(string({expr}))"
