"""Chip-hour prices as cited data: list prices per chip beside the chip rows (`data/prices.json`, each with
its source and date), and the user's own (`--price v5p=4.20`, or a file of them), which replace them."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cost_models.errors import CpplanError, unknown_name

PRICES_FILE = Path(__file__).parent / "data" / "prices.json"
# the price kinds a row may publish, in the order they are preferred when none is asked for
KINDS = ("on_demand", "spot", "committed_1y", "committed_3y")
GIVEN = "given"  # the kind of a price the user gave


@dataclass(frozen=True)
class ChipPrice:
    """What one chip-hour costs, and where the figure comes from.

    Attributes:
        chip: the chip row's name.
        per_chip_hour: US dollars per chip-hour.
        kind: `on_demand`, `spot`, `committed_1y`, `committed_3y`, or `given` (by the user).
        source: the citation (or what the user gave); date: when it was published ('' for a given one).
    """

    chip: str
    per_chip_hour: float
    kind: str
    source: str
    date: str = ""

    def describe(self) -> str:
        """E.g. '$2.70 per chip-hour (on_demand, 2024-12: Google's …)'."""
        when = f", {self.date}" if self.date else ""
        return f"${self.per_chip_hour:.2f} per chip-hour ({self.kind.replace('_', ' ')}{when}: {self.source})"

    def short(self) -> str:
        """E.g. '$2.70 per chip-hour (on demand)'."""
        return f"${self.per_chip_hour:.2f} per chip-hour ({self.kind.replace('_', ' ')})"

    def to_dict(self) -> dict:
        return {
            "chip": self.chip,
            "per_chip_hour_usd": self.per_chip_hour,
            "kind": self.kind,
            "source": self.source,
            "date": self.date,
        }


@lru_cache(maxsize=1)
def _table() -> dict:
    try:
        return json.loads(PRICES_FILE.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CpplanError(f"cannot read the price table {str(PRICES_FILE)!r} ({err}); restore it from git.") from None


def list_price(chip: str, kind: str = "on_demand") -> ChipPrice | None:
    """The published price of one chip-hour of `chip` of `kind`, or None where none is published.

    Raises:
        CpplanError: `kind` is not one of `KINDS`, or the price table is unreadable.
    """
    if kind not in KINDS:
        raise CpplanError(f"price kind {kind!r} is not one of {', '.join(KINDS)}; give one of them.")
    row = _table()["chips"].get(chip)
    if row is None or row.get(kind) is None:
        return None
    return ChipPrice(chip, float(row[kind]), kind, row["source"], row["date"])


def unpublished_note(chip: str) -> str:
    """Why `chip` has no list price (the table's note, or that it has none)."""
    return _table().get("unpublished", {}).get(chip, "no per-chip-hour price in the price table")


def check_price(chip: str, value, origin: str) -> float:
    """`value` as a price per chip-hour: a positive, finite number.

    Raises:
        CpplanError: it is not one, naming `origin` (where it was given).
    """
    try:
        price = float(value)
    except (TypeError, ValueError):
        price = math.nan
    if isinstance(value, bool) or not math.isfinite(price) or price <= 0:
        raise CpplanError(
            f"{origin}: the price of a {chip} chip-hour must be a positive number of US dollars, got {value!r}; "
            f"e.g. {chip}=4.20."
        )
    return price


def parse_prices(text: str, known: "list[str] | set[str]") -> dict[str, float]:
    """`--price`: `CHIP=DOLLARS` pairs separated by commas, or the path of a file holding them (a JSON object
    of chip to dollars, or one pair a line).

    Args:
        text: what the user gave.
        known: the chip names that may be priced.
    Returns:
        Dollars per chip-hour by chip.
    Raises:
        CpplanError: an unknown chip, a chip given twice, a price that is not a positive number, or text that
            is neither pairs nor a readable file.
    """
    if os.path.isfile(text):
        try:
            body = Path(text).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise CpplanError(f"--price {text!r}: cannot read it ({err}); give CHIP=DOLLARS pairs or a file.") from None
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            pairs = [line.split("#")[0].strip() for line in body.splitlines()]
            return _pairs([p for p in pairs if p], known, f"--price file {text!r}")
        if not isinstance(data, dict):
            raise CpplanError(
                f'--price file {text!r}: a JSON price file is an object of chip to dollars, e.g. {{"v5p": 4.20}}.'
            )
        return _pairs([f"{k}={v}" for k, v in data.items()], known, f"--price file {text!r}")
    return _pairs([w.strip() for w in text.split(",") if w.strip()], known, "--price")


def _pairs(words: list[str], known, origin: str) -> dict[str, float]:
    if not words:
        raise CpplanError(f"{origin} names no price; give CHIP=DOLLARS pairs, e.g. v5p=4.20,tpu7x=6.00.")
    out: dict[str, float] = {}
    for word in words:
        chip, sep, value = (part.strip() for part in word.partition("="))
        if not sep:
            raise CpplanError(f"{origin} {word!r}: write CHIP=DOLLARS per chip-hour, e.g. v5p=4.20.")
        if chip not in known:
            raise unknown_name("chip", chip, known)
        if chip in out:
            raise CpplanError(f"{origin} prices {chip} twice ({out[chip]} and {value}); give each chip once.")
        out[chip] = check_price(chip, value, origin)
    return out


def price_of(chip: str, given: "dict[str, float] | None" = None, kind: str = "on_demand") -> ChipPrice | None:
    """The price a chip-hour of `chip` is costed at: the user's where given, else the published one of `kind`,
    else None (time only)."""
    if given and chip in given:
        return ChipPrice(chip, given[chip], GIVEN, "--price")
    return list_price(chip, kind)
