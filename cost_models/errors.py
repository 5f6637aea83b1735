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


def from_fields(cls, row, *, what: str):
    """A frozen dataclass `cls` from its JSON object `row`, naming missing or unknown fields (`what`: how the
    message names the object, e.g. "a model").

    Raises:
        CpplanError: not an object, a missing or unknown field.
    """
    import dataclasses

    fields = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(row, dict):
        raise CpplanError(
            f"{what} is a JSON object of fields ({', '.join(fields)}), not {type(row).__name__}: {row!r:.80}."
        )
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    missing, extra = [f for f in required if f not in row], sorted(set(row) - set(fields))
    if missing or extra:
        raise CpplanError(f"{what}'s fields: missing {missing}, unknown {extra}; it has {', '.join(fields)}.")
    return cls(**row)
