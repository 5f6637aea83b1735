"""Which slice to book: the best plan on every slice size of the chips asked for, the time and cost of
training a token budget on each, the Pareto front of time against cost, and the cheapest slice that
meets a deadline."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cost_models.accuracy import ErrorBand
from cost_models.chips import Chip, known_chips
from cost_models.errors import CpplanError, unknown_name
from cost_models.estimate import Estimate
from cost_models.models import ModelSpec, get_model
from cost_models.prices import ChipPrice, check_price, price_of, unpublished_note
from cost_models.targets import Target
from cost_models.topology import Topology, shape_for_chips, slices_of
from planner.estimate import plan_error_band
from planner.options import format_tokens, parse_seq_len
from planner.plan import Plan
from planner.processes import map_in_processes

if TYPE_CHECKING:
    from planner.search import Ranked

DAY_S = 86400.0
MULTI_SLICES = (2, 3, 4)  # slices of a full pod joined over DCN, beyond one pod
# a token budget's suffixes: decimal, as budgets are quoted (100B = 1e11), unlike sequence lengths
BUDGET_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
DEADLINE_UNITS = {"h": 1 / 24, "d": 1.0, "w": 7.0}


def parse_budget(text) -> int:
    """A token budget: a whole number, or one with a decimal suffix (`100B`, `1.5T`, `500M`).

    Raises:
        CpplanError: it is not one, or not at least one token.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        tokens = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]?)\s*", str(text), re.IGNORECASE)
        if m is None or m.group(2).upper() not in BUDGET_SUFFIXES:
            raise CpplanError(
                f"--tokens {text!r} is not a token budget; write a number with K, M, B or T (decimal), e.g. 100B."
            )
        tokens = round(float(m.group(1)) * BUDGET_SUFFIXES[m.group(2).upper()])
    if tokens < 1:
        raise CpplanError(
            f"--tokens {text!r}: a budget must be at least one token; give the tokens to train, e.g. 100B."
        )
    return tokens


def parse_deadline(text, today: datetime.date | None = None) -> float:
    """A deadline in days from now: a duration (`14d`, `2w`, `36h`) or a date (`2027-03-01`).

    Raises:
        CpplanError: it is neither, or is not after now (a non-positive duration, a date today or past).
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        days = float(text)
    else:
        word = str(text).strip().lower()
        m = re.fullmatch(r"(-?[0-9]*\.?[0-9]+)\s*([hdw])", word)
        if m:
            days = float(m.group(1)) * DEADLINE_UNITS[m.group(2)]
        else:
            try:
                day = datetime.date.fromisoformat(word)
            except ValueError:
                raise CpplanError(
                    f"--within {text!r} is not a deadline; write a duration (14d, 2w, 36h) or a date (YYYY-MM-DD)."
                ) from None
            today = today or datetime.date.today()
            days = float((day - today).days)
            if days <= 0:
                raise CpplanError(
                    f"--within {text!r} is not after today ({today.isoformat()}); give a later date or a duration."
                )
    if not math.isfinite(days) or days <= 0:
        raise CpplanError(f"--within {text!r}: a deadline must be a positive time from now, e.g. 14d.")
    return days


def tpu_chips(names: "list[str] | None" = None) -> list[Chip]:
    """The chips to consider: the named ones (default every chip row with a torus), in the order given.

    Raises:
        CpplanError: an unknown chip, a chip without slices (a host), or none named.
    """
    rows = known_chips()
    if names is None:
        return [chip for chip in rows.values() if chip.kind.has_torus]
    if not names:
        raise CpplanError("--chips names no chip; give chip names separated by commas, e.g. v5p,tpu7x.")
    out = []
    for name in names:
        if name not in rows:
            raise unknown_name("chip", name, [n for n, c in rows.items() if c.kind.has_torus])
        if not rows[name].kind.has_torus:
            raise CpplanError(f"--chips {name}: {name} has no slices to book (a host's devices); name a TPU chip.")
        if rows[name] not in out:
            out.append(rows[name])
    return out


def slice_ladder(chip: Chip) -> list[Topology]:
    """The slices of `chip` to search: its smallest, then twice, four times … the chips (the most cubic shape
    of each, as `CHIP-N` names it), the full pod, and 2-4 full pods over DCN.

    Doubling keeps a power-of-two batch splitting evenly; sizes between two rungs run the smaller rung's plans
    side by side (more data parallelism), at about its time per chip and so its cost."""
    smallest = slices_of(chip)[0].num_chips
    counts, chips = [], smallest
    while chips < chip.max_chips:
        counts.append(chips)
        chips *= 2
    counts.append(chip.max_chips)
    one = [
        Topology(chip, dims, chip.devices_per_chip) for dims in map(lambda n: shape_for_chips(chip, n), counts) if dims
    ]
    return one + [dataclasses.replace(one[-1], num_slices=n) for n in MULTI_SLICES]


@dataclass(frozen=True)
class SliceRow:
    """One slice's answer: its best plan and what training the budget on it takes.

    Attributes:
        topology: the slice's canonical name; chips: its chip count (all slices).
        plan, estimate: the best plan and its predicted step, as `explain` gives them.
        band: the measured step-time error of this chip in the plan's regime (None where unmeasured).
        steps: whole steps to train the budget; seconds: their time.
        price: the chip-hour price costed (None: time only).
    """

    topology: str
    chip: str
    chips: int
    plan: Plan
    estimate: Estimate
    band: ErrorBand | None
    steps: int
    seconds: float
    price: ChipPrice | None

    @property
    def tokens_per_s(self) -> float:
        return self.estimate.tokens_per_step / self.estimate.step_time_s

    @property
    def days(self) -> float:
        return self.seconds / DAY_S

    @property
    def chip_hours(self) -> float:
        return self.chips * self.seconds / 3600

    @property
    def cost(self) -> float | None:
        return None if self.price is None else self.chip_hours * self.price.per_chip_hour

    def days_range(self) -> tuple[float, float]:
        """The days within the step time's measured error band (the days themselves where none is measured)."""
        r = self.band.relative if self.band else 0.0
        return self.days * (1 - r), self.days * (1 + r)

    def to_dict(self) -> dict:
        from planner.explanation import short

        return {
            "topology": self.topology,
            "chip": self.chip,
            "chips": self.chips,
            "plan_line": short(self.plan),
            "plan": self.plan.to_dict(),
            "step_time_s": self.estimate.step_time_s,
            "error_band": self.band.to_dict() if self.band else None,
            "tokens_per_step": self.estimate.tokens_per_step,
            "tokens_per_s": self.tokens_per_s,
            "steps": self.steps,
            "days": self.days,
            "days_range": list(self.days_range()),
            "chip_hours": self.chip_hours,
            "cost_usd": self.cost,
            "price": self.price.to_dict() if self.price else None,
        }


def pareto_front(rows: list[SliceRow]) -> list[SliceRow]:
    """The priced rows no other priced row beats on both days and cost (and ties on neither), fastest first."""
    priced = sorted((r for r in rows if r.cost is not None), key=lambda r: (r.seconds, r.cost))
    front, cheapest = [], math.inf
    for r in priced:
        if r.cost < cheapest:
            front.append(r)
            cheapest = r.cost
    return front


@dataclass(frozen=True)
class Booking:
    """The answer of `book`; ``str()`` is the report, ``to_dict()`` its JSON.

    Attributes:
        model, seq_len, tokens: the request; deadline_days: `within` in days (None: no deadline).
        rows: a row per slice a plan fits, chip by chip, fewest chips first.
        unfit: the slices searched on which nothing fits.
        prices: the chip-hour price used per chip (None: no price, time only), with why none.
    """

    model: str
    seq_len: int
    tokens: int
    deadline_days: float | None
    rows: tuple[SliceRow, ...]
    unfit: tuple[str, ...]
    prices: dict

    @property
    def front(self) -> list[SliceRow]:
        return pareto_front(list(self.rows))

    def meeting(self) -> list[SliceRow]:
        """The rows that train the budget within the deadline (every row without one)."""
        if self.deadline_days is None:
            return list(self.rows)
        return [r for r in self.rows if r.days <= self.deadline_days]

    @property
    def choice(self) -> SliceRow | None:
        """The cheapest priced slice that meets the deadline (of equal cost, the faster), or None."""
        priced = [r for r in self.meeting() if r.cost is not None]
        return min(priced, key=lambda r: (r.cost, r.seconds), default=None)

    def verdict(self) -> str:
        """One sentence: the slice to book, or why none, and what comes nearest."""
        within = "" if self.deadline_days is None else f" within {_days(self.deadline_days)}"
        if not self.rows:
            return f"No slice searched fits {self.model} at {format_tokens(self.seq_len)} tokens per sequence."
        choice = self.choice
        if choice is not None:
            low, high = choice.days_range()
            return (
                f"Book {choice.topology}: the cheapest slice that trains {_tokens(self.tokens)} tokens{within}, "
                f"in {_days(choice.days)} ({_days(low)}–{_days(high)} within the error band) for "
                f"${choice.cost:,.0f} at {choice.price.short()}."
            )
        meeting = self.meeting()
        if meeting:  # only unpriced slices meet it
            fastest = min(meeting, key=lambda r: r.seconds)
            return (
                f"No priced slice trains {_tokens(self.tokens)} tokens{within}; {len(meeting)} without a price do, the "
                f"smallest {min(meeting, key=lambda r: r.chips).topology}, the fastest {fastest.topology} "
                f"({_days(fastest.days)}); give --price to cost them."
            )
        nearest = min(self.rows, key=lambda r: r.seconds)
        return (
            f"No slice trains {_tokens(self.tokens)} tokens{within}; the nearest is {nearest.topology}, "
            f"{_days(nearest.days)} ({nearest.days / self.deadline_days - 1:+.0%} over the deadline): "
            f"allow more time, fewer tokens, or more chips (--chips)."
        )

    def __str__(self) -> str:
        from planner.explanation import format_seconds, short

        front = {r.topology for r in self.front}
        meets = {r.topology for r in self.meeting()} if self.deadline_days is not None else set()
        head = f"{self.model} at {format_tokens(self.seq_len)} tokens per sequence: {_tokens(self.tokens)} tokens" + (
            "" if self.deadline_days is None else f" within {_days(self.deadline_days)}"
        )
        lines = [head, ""]
        cols = f"{'':2}{'slice':<20} {'chips':>6}  {'step (± band)':>16} {'tokens/s':>9} {'days':>8} "
        lines.append(cols + f"{'chip-hours':>11} {'cost':>12}  best plan")
        for r in self.rows:
            mark = ("*" if r.topology in front else " ") + ("✓" if r.topology in meets else " ")
            band = f"±{r.band.relative:.0%}" if r.band else "±?"
            cost = f"${r.cost:,.0f}" if r.cost is not None else "—"
            lines.append(
                f"{mark}{r.topology:<20} {r.chips:>6}  {format_seconds(r.estimate.step_time_s):>10} {band:>5} "
                f"{_rate(r.tokens_per_s):>9} {r.days:>8.1f} {r.chip_hours:>11,.0f} {cost:>12}  {short(r.plan)}"
            )
        lines.append("")
        lines.append("(*: on the Pareto front of days against cost" + (", ✓: meets the deadline)" if meets else ")"))
        lines.append(
            "(step: the best plan's predicted step, as `cpplan explain` gives it on that slice; ± its chip's "
            "measured step-time error, cost_models/accuracy.py; days: whole steps to train the budget)"
        )
        if self.unfit:
            lines.append(f"(nothing fits on {', '.join(self.unfit)})")
        lines.append("Prices:")
        for chip, price in self.prices.items():
            lines.append(f"  {chip}: " + (price.describe() if isinstance(price, ChipPrice) else f"time only — {price}"))
        lines.append("")
        lines.append(self.verdict())
        return "\n".join(lines)

    def to_dict(self) -> dict:
        choice = self.choice
        front = [r.topology for r in self.front]
        return {
            "book": True,
            "model": self.model,
            "seq_len": self.seq_len,
            "tokens": self.tokens,
            "deadline_days": self.deadline_days,
            "slices": [dict(r.to_dict(), on_front=r.topology in front) for r in self.rows],
            "unfit": list(self.unfit),
            "front": front,
            "choice": choice.topology if choice else None,
            "verdict": self.verdict(),
            "prices": {
                chip: price.to_dict() if isinstance(price, ChipPrice) else {"none": price}
                for chip, price in self.prices.items()
            },
        }


def book(
    model,
    seq_len,
    *,
    tokens,
    within=None,
    chips: "list[str] | None" = None,
    prices: "dict[str, float] | None" = None,
    price_kind: str = "on_demand",
    **options,
) -> Booking:
    """The best plan on every slice of the chips asked for, and the time and cost of a token budget on each.

    Args:
        model: a model name, a `ModelSpec`, or a config.json path.
        seq_len: tokens per sequence (``1M``, ``131072``).
        tokens: the budget to train (``100B`` or an int).
        within: a deadline (``14d``, ``2w``, a date, or days as a number); None for none.
        chips: chip names (default every TPU chip row).
        prices: dollars per chip-hour by chip, replacing the published list prices.
        price_kind: the published price used where none is given: ``on_demand``, ``spot``,
            ``committed_1y`` or ``committed_3y``.
        **options: the search options of `planner.explain` (not `num_slices`: book chooses the slices).
    Returns:
        A `Booking`.
    Raises:
        CpplanError: bad input (a budget under one token, a deadline not in the future, an unknown chip, a
            price that is not a positive number, a search option that does not parse).
    """
    if "num_slices" in options:
        raise CpplanError("book searches 1 to 4 slices itself; drop num_slices.")
    budget = parse_budget(tokens)
    deadline = None if within is None else parse_deadline(within)
    rows_of = tpu_chips(chips)
    given = {name: check_price(name, value, "prices") for name, value in (prices or {}).items()}
    for name in given:
        if name not in known_chips():
            raise unknown_name("chip", name, known_chips())
    spec, length = get_model(model), parse_seq_len(seq_len)
    chip_prices = {chip.name: price_of(chip.name, given, price_kind) for chip in rows_of}
    used = {name: price if price else unpublished_note(name) for name, price in chip_prices.items()}
    # each chip's slices searched apart (a process per free core): the search is a pure function of its inputs
    ladders = map_in_processes(functools.partial(_best_on_ladder, spec, length, options), rows_of)
    rows, unfit = [], []
    for chip, ladder in zip(rows_of, ladders):
        for topo, best in ladder:
            if best is None:
                unfit.append(topo.name)
                continue
            rows.append(_row(topo, best.plan, best.estimate, budget, chip_prices[chip.name]))
    return Booking(spec.name, length, budget, deadline, tuple(rows), tuple(unfit), used)


def _best_on_ladder(spec: ModelSpec, length: int, options: dict, chip: Chip) -> list[tuple[Topology, Ranked | None]]:
    """Each slice of `chip`'s ladder with the best plan `explain` gives on it (None where nothing fits)."""
    from planner.api import run_search

    return [(topo, run_search(spec, length, topo, **dict(options)).best) for topo in slice_ladder(chip)]


def _row(topo: Topology, plan: Plan, estimate: Estimate, budget: int, price: ChipPrice | None) -> SliceRow:
    steps = -(-budget // estimate.tokens_per_step)  # the budget in whole steps
    band = plan_error_band(plan, Target.CPPLAN)  # book prices cpplan's runtime
    return SliceRow(
        topo.name, topo.chip.name, topo.num_chips, plan, estimate, band, steps, steps * estimate.step_time_s, price
    )


def _days(days: float) -> str:
    return f"{days:.1f} days" if days >= 1 else f"{days * 24:.1f} hours"


def _tokens(tokens: int) -> str:
    for suffix, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if tokens >= size:
            return f"{tokens / size:g}{suffix}"
    return str(tokens)


def _rate(tokens_per_s: float) -> str:
    for suffix, size in (("M", 1e6), ("K", 1e3)):
        if tokens_per_s >= size:
            return f"{tokens_per_s / size:.1f}{suffix}"
    return f"{tokens_per_s:.0f}"
