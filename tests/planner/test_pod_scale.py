"""Plans at pod scale: every slice and batch gets a plan or checked advice."""

import pytest
from bounded_work import at_most_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner
from cost_models.chips import known_chips
from cost_models.errors import CpplanError
from cost_models.models import MODELS
from cost_models.topology import get_topology, max_host_devices, slices_of

pytestmark = pytest.mark.pure
TORUS_CHIPS = [chip for chip in known_chips().values() if chip.kind.has_torus]
SLICES = [topo.name for chip in TORUS_CHIPS for topo in slices_of(chip)]


@pytest.mark.parametrize("topology, odd", [("v5p:16x20x28", 35), ("tpu7x:16x24x24", 9)])
def test_full_pods_plan_at_4m_tokens(topology, odd):
    # one 4M-token sequence cannot split over 2^8·35 or 2^10·9 devices: the sequences carry the odd factor
    e = planner.explain("llama3.1-8b", "4M", topology)
    assert e.best is not None
    mesh = e.best.mesh_dict
    assert e.result.global_batch % odd == 0 and (mesh["data"] * mesh["fsdp"]) % odd == 0
    assert (
        f"no mesh splits up to twice the target's sequences over {e.result.topology.num_devices} devices"
        in e.result.batch_note
    )


def test_a_target_the_pod_cannot_split_takes_the_nearest_count_that_it_can():
    # 64 sequences of 4M tokens cannot split over 2^8·35 chips; 70 = 2 × 35 is the nearest count that can
    near = planner.explain("llama3.1-8b", "4M", "v5p:16x20x28", global_batch_tokens=64 * 4 * 2**20)
    assert near.result.global_batch == 70 and near.best is not None
    # an exact count is kept, and the advice names the counts that fit
    exact = planner.explain("llama3.1-8b", "4M", "v5p:16x20x28", global_batch=64)
    assert exact.best is None
    assert [a.found.global_batch for a in exact.advice() if a.change.startswith("global_batch=")] == [70]


@pytest.mark.parametrize("topology", ["v5p-256", "v5p-512", "tpu7x-256", "v5e:16x16", "v5p:16x20x28"])
def test_max_seq_len_answers_on_slices_too_large_for_1024_tokens(topology):
    longest = planner.max_seq_len("llama3.1-8b", topology)
    assert longest.seq_len >= 8 * 2**20 and longest.plan.seq_len == longest.seq_len
    assert longest.plan.topology == get_topology(topology).name
    assert str(longest).startswith(f"llama3.1-8b on {longest.plan.topology}: up to ")
    assert longest.to_dict()["max_seq_len"] == longest.seq_len


def test_a_billion_tokens_on_v5p_256_gets_checked_advice():
    e = planner.explain("llama3.1-8b", "1G", "v5p-256")
    text = str(e)
    assert e.best is None and "no sequence length fits" not in text
    changes = [a.change for a in e.advice()]
    assert any(c.startswith("a shorter sequence, the longest that fits") for c in changes)
    assert any(c.startswith("a larger slice, v5p:") for c in changes)
    for advice in e.advice():
        followed = planner.explain("llama3.1-8b", advice.seq_len, advice.topology, **advice.options)
        assert followed.best is not None, advice.change
        assert f"{advice.change}: " in text


def test_a_larger_slice_is_offered_only_when_one_exists():
    e = planner.explain("llama3.1-405b", "4M", "v5p:16x20x28")  # the full pod: no larger slice
    if e.best is None:
        assert not any(a.change.startswith("a larger slice") for a in e.advice())


def test_a_fixed_mesh_that_does_not_cover_the_devices_is_refused_first():
    with pytest.raises(CpplanError, match=r"mesh context=16 spans 16 devices; cpu:8 has 8"):
        planner.explain("tiny", 1024, "cpu:8", mesh={"context": 16})
    with pytest.raises(CpplanError, match=r"covers 8 of v5p:2x2x4's 16 devices"):
        planner.explain(
            "tiny", 1024, "v5p:2x2x4", mesh={"data": 1, "fsdp": 2, "context": 4, "context_ulysses": 1, "tensor": 1}
        )


@pytest.mark.parametrize(
    "name, words",
    [
        ("v5p-99999999999998", "the largest v5p pod has 8960 chips (v5p-17920)"),
        ("tpu7x-10000000000000000000000", "the largest tpu7x pod has 9216 chips"),
        ("cpu:999999999999", f"N is at most {max_host_devices()}"),
    ],
)
def test_topology_names_answer_at_once(name, words):
    # at once: before any walk over the divisors of the count (reading the chip rows cold is a few
    # thousand lines of Python; the divisors of 10^13 chips would take millions)
    with at_most_lines(50_000), pytest.raises(CpplanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        get_topology(name)


def test_every_slice_of_the_catalogue_is_a_name_that_parses_to_itself():
    for name in SLICES:
        topo = get_topology(name)
        assert topo.name == name and topo.num_chips <= topo.chip.max_chips
    assert {"v5p:16x20x28", "tpu7x:16x24x24", "v5e:16x16", "v5p:4x4x12"} <= set(SLICES)
    assert "v5p:4x4x6" not in SLICES  # beyond the small shapes every side is a multiple of 4


def test_evaluate_prices_the_batch_it_is_given():
    e = planner.evaluate(
        "llama3.1-8b", "256k", "v5p:2x2x2", strategy="ring", mesh={"context": 8}, global_batch_tokens="1M"
    )
    assert e.tokens_per_step == 2**20  # four sequences, not the count nearest some target
    with pytest.raises(CpplanError, match="not a whole number of 262144-token sequences"):
        planner.evaluate(
            "llama3.1-8b", "256k", "v5p:2x2x2", strategy="ring", mesh={"context": 8}, global_batch_tokens="300k"
        )


def _chains():
    """A few chains of slices per chip, fewest chips first: the smallest, one with a side of 12
    where the chip has one, a middle one, and the full pod."""
    out = []
    for chip in TORUS_CHIPS:
        slices = slices_of(chip)
        odd = [t for t in slices if 12 in t.chip_dims and t.num_chips <= 512][:1]
        chain = sorted({slices[0], *odd, slices[len(slices) // 2], slices[-1]}, key=lambda t: t.num_chips)
        out.append(pytest.param([t.name for t in chain], id=chip.name))
    return out


@pytest.mark.parametrize("chain", _chains())
def test_more_chips_never_shorten_max_seq_len(chain):
    previous = 0
    for name in chain:
        try:
            longest = planner.max_seq_len("llama3.1-8b", name).seq_len
        except CpplanError:
            longest = 0
        assert longest >= previous, (name, longest, previous)
        previous = longest


@st.composite
def requests(draw):
    topology = draw(st.sampled_from(SLICES + ["cpu:8", "cpu:6"]))
    model = draw(st.sampled_from(sorted(MODELS)))
    exponent = draw(st.integers(10, 25))
    seq_len = min(2**exponent * draw(st.sampled_from([1, 3, 5])), 32 * 2**20)
    batch = draw(
        st.sampled_from(
            [
                {},
                {"global_batch_tokens": seq_len * draw(st.sampled_from([1, 2, 3, 35, 64]))},
                {"global_batch": draw(st.sampled_from([1, 2, 9, 35]))},
            ]
        )
    )
    # 1–4 slices over DCN (a host has one)
    slices = 1 if topology.startswith("cpu") else draw(st.integers(1, 4))
    return model, seq_len, topology, dict(batch, num_slices=slices)


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_request_gets_a_plan_or_advice_that_yields_one(request):
    model, seq_len, topology, batch = request
    e = planner.explain(model, seq_len, topology, **batch)
    if e.best is not None:
        assert e.estimate.fits
        return
    with pytest.raises(CpplanError, match="What would fit"):
        planner.plan(model, seq_len, topology, **batch)
    for advice in e.advice():
        assert planner.plan(model, advice.seq_len, advice.topology, **advice.options).seq_len == advice.seq_len
    chip = get_topology(topology).chip
    if not e.advice() and chip.kind.has_torus:
        # no advice is true only where not even the full pod fits the request
        assert "nothing found" in str(e)
        assert planner.explain(model, seq_len, slices_of(chip)[-1], **batch).best is None


def test_every_slice_count_is_a_name_that_parses_to_itself():
    for slices in range(1, 5):
        for name in ("v5p:2x2x1", "tpu7x:16x24x24", "v5e:16x16"):
            topo = get_topology(name, num_slices=slices)
            assert get_topology(topo.name) == topo and topo.num_devices == slices * get_topology(name).num_devices
