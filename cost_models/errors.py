"""User-facing errors: each names the bad value, the rule it broke and how to fix it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class CpplanError(ValueError):
    """Raised for bad user input; the message is meant to be shown as is, without a traceback."""


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to `name`, or None when nothing is close."""
    matches = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.5)
    if not matches:
        return None
    by_lower = {k.lower(): k for k in known}
    return by_lower[matches[0]]


def unknown_name(kind: str, name: str, known: Iterable[str]) -> CpplanError:
    """An error for an unknown `kind` (model, chip, ...) listing the known ones and the closest match."""
    known = sorted(known)
    hint = closest(name, known)
    did_you_mean = f" Did you mean {hint!r}?" if hint else ""
    # "Known:" rather than a plural made from `kind`, which would misspell "strategy" and "remat policy"
    return CpplanError(f"unknown {kind} {name!r}.{did_you_mean} Known: {', '.join(known)}.")


def member(enum_type, value, *, lead: str, tail: str = "."):
    """`value` as a member of `enum_type`; where it is none, a CpplanError of `lead`, the members' values
    and `tail` (e.g. lead "… the masks are", tail ".")."""
    try:
        return enum_type(value)
    except ValueError:
        raise CpplanError(f"{lead} {', '.join(m.value for m in enum_type)}{tail}") from None
