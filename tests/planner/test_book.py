"""`planner.book`: every slice's line is `explain`'s answer on that slice; the budget's days, chip-hours
and cost by hand; the Pareto front and the deadline's choice as properties; prices and inputs parsed."""

import datetime
import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

import planner
from cost_models.chips import known_chips
from cost_models.errors import CpplanError
from cost_models.prices import ChipPrice, list_price, parse_prices, price_of
from planner.book import (
    Booking,
    SliceRow,
    book,
    pareto_front,
    parse_budget,
    parse_deadline,
    slice_ladder,
    tpu_chips,
)

pytestmark = pytest.mark.pure

MODEL, SEQ = "llama3.1-8b", "1M"


@pytest.fixture(scope="module")
def v6e_booking() -> Booking:
    return book(MODEL, SEQ, tokens="100B", within="30d", chips=["v6e"])


def forget_shared_work() -> None:
    """Empties the caches one search leaves for the next (meshes, blocks, verdicts, placements, remat tables), so
    that an explanation after it is worked out from nothing, as in a fresh process."""
    from cost_models.remat import remat_table
    from planner.search import _judged, _placements, _searched_meshes, _splash_blocks

    for cache in (_searched_meshes, _splash_blocks, _judged, _placements, remat_table):
        cache.cache_clear()


def test_every_slice_line_is_explains_answer_on_that_slice(v6e_booking):
    assert len(v6e_booking.rows) >= 5  # 16 chips to the pod, and 2-4 pods
    for row in v6e_booking.rows:
        forget_shared_work()  # book reuses one slice's work on the next: explain does it all afresh
        explained = planner.explain(MODEL, SEQ, row.topology)
        assert explained.best == row.plan, row.topology
        assert explained.estimate.to_dict() == row.estimate.to_dict(), row.topology
        assert explained.error_band == row.band
    # the slices too small for one sequence are the ones explain finds nothing on
    for name in v6e_booking.unfit:
        assert planner.explain(MODEL, SEQ, name).best is None


def test_ladder_doubles_from_the_smallest_slice_to_the_pod_then_adds_pods_over_dcn():
    chip = known_chips()["v5p"]
    ladder = slice_ladder(chip)
    one = [t for t in ladder if t.num_slices == 1]
    assert [t.num_chips for t in one] == [4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 8960]
    assert [(t.num_slices, t.chips_per_slice) for t in ladder[len(one) :]] == [(2, 8960), (3, 8960), (4, 8960)]
    assert one[5].name == "v5p:4x4x8"  # the most cubic shape, as v5p-256 names it


def _row(chips=8, step=2.0, tokens_per_step=4096, budget=10_000, price=1.5, name="a"):
    steps = -(-budget // tokens_per_step)
    estimate = SimpleNamespace(step_time_s=step, tokens_per_step=tokens_per_step)
    cost = None if price is None else ChipPrice("v6e", price, "given", "test")
    return SliceRow(name, "v6e", chips, None, estimate, None, steps, steps * step, cost)


def test_days_chip_hours_and_cost_by_hand():
    row = _row()  # 10,000 tokens at 4,096 a step: 3 whole steps of 2 s on 8 chips at $1.50
    assert row.steps == 3
    assert row.seconds == 6.0
    assert row.days == pytest.approx(6 / 86400)
    assert row.chip_hours == pytest.approx(8 * 6 / 3600)
    assert row.cost == pytest.approx(8 * 6 / 3600 * 1.5)
    assert row.tokens_per_s == pytest.approx(2048)
    assert _row(price=None).cost is None


rows = st.lists(
    st.tuples(st.integers(1, 1000), st.floats(0.1, 1e4), st.one_of(st.none(), st.floats(0.1, 10))), max_size=12
)


@given(rows)
def test_front_is_exactly_the_undominated_priced_rows(spec):
    made = [_row(chips=c, step=s, price=p, name=str(i)) for i, (c, s, p) in enumerate(spec)]
    front = pareto_front(made)
    priced = [r for r in made if r.cost is not None]

    def beaten(r):
        return any(
            o.seconds <= r.seconds and o.cost <= r.cost and (o.seconds, o.cost) != (r.seconds, r.cost) for o in priced
        )

    assert all(not beaten(r) for r in front)
    for r in priced:  # off the front: beaten, or the same point as a front row
        assert r in front or beaten(r) or any((f.seconds, f.cost) == (r.seconds, r.cost) for f in front)


@given(rows, st.floats(1e-6, 1.0))
def test_choice_is_the_cheapest_priced_row_within_the_deadline(spec, deadline):
    made = tuple(_row(chips=c, step=s, price=p, name=str(i)) for i, (c, s, p) in enumerate(spec))
    answer = Booking("m", 1, 10_000, deadline, made, (), {})
    meeting = [r for r in made if r.cost is not None and r.days <= deadline]
    if meeting:
        assert answer.choice.cost == min(r.cost for r in meeting)
        assert answer.verdict().startswith(f"Book {answer.choice.topology}")
    else:
        assert answer.choice is None
        if made and not any(r.days <= deadline for r in made):
            nearest = min(made, key=lambda r: r.seconds)
            assert f"the nearest is {nearest.topology}," in answer.verdict()


def test_text_and_json_carry_no_nan_and_name_the_price(v6e_booking):
    text = str(v6e_booking)
    assert "nan" not in text.lower()
    assert "$2.70 per chip-hour (on demand, 2024-12" in text
    data = json.loads(json.dumps(v6e_booking.to_dict(), allow_nan=False))
    assert data["choice"] in data["front"]
    assert all(s["on_front"] == (s["topology"] in data["front"]) for s in data["slices"])


def test_budget_and_deadline_parse():
    assert parse_budget("100B") == 10**11
    assert parse_budget("1.5T") == 1_500_000_000_000
    assert parse_budget("500m") == 500_000_000
    assert parse_deadline("2w") == 14.0
    assert parse_deadline("36h") == 1.5
    assert parse_deadline("2027-01-04", today=datetime.date(2027, 1, 1)) == 3.0
    for bad in ("0", "-5B", "abc", "1X"):
        with pytest.raises(CpplanError, match="--tokens"):
            parse_budget(bad)
    for bad in ("0d", "-1d", "soon", "2026-12-31"):
        with pytest.raises(CpplanError, match="--within"):
            parse_deadline(bad, today=datetime.date(2027, 1, 1))


def test_prices_cited_given_and_refused(tmp_path):
    v6e = list_price("v6e")
    assert (v6e.per_chip_hour, v6e.kind, v6e.date) == (2.70, "on_demand", "2024-12")
    assert list_price("v6e", "committed_3y").per_chip_hour == 1.22
    assert list_price("v5p") is None  # none published: time only
    assert price_of("v5p", {"v5p": 4.2}).describe().startswith("$4.20 per chip-hour (given: --price)")
    known = ["v5p", "v6e"]
    assert parse_prices("v5p=4.20, v6e=2", known) == {"v5p": 4.2, "v6e": 2.0}
    (tmp_path / "p.json").write_text('{"v5p": 3}')
    (tmp_path / "p.txt").write_text("# ours\nv6e=1.1\n")
    assert parse_prices(str(tmp_path / "p.json"), known) == {"v5p": 3.0}
    assert parse_prices(str(tmp_path / "p.txt"), known) == {"v6e": 1.1}
    for bad, rule in (("v5p=0", "positive"), ("v5p=nan", "positive"), ("v5q=1", "unknown chip"), ("v5p", "CHIP=")):
        with pytest.raises(CpplanError, match=rule):
            parse_prices(bad, known)


def test_chips_default_to_every_tpu_row_and_refuse_hosts():
    assert {c.name for c in tpu_chips()} == {n for n, c in known_chips().items() if c.kind.has_torus}
    with pytest.raises(CpplanError, match="no slices"):
        tpu_chips(["cpu"])
    with pytest.raises(CpplanError, match="Did you mean 'v5p'"):
        tpu_chips(["v5q"])
    with pytest.raises(CpplanError, match="num_slices"):
        book(MODEL, SEQ, tokens="1B", num_slices=2)
    assert math.isclose(
        book(MODEL, SEQ, tokens="1B", chips=["v5e"], prices={"v5e": 1.0}).rows[0].price.per_chip_hour, 1.0
    )
