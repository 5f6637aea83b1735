"""The step-time band widens where fewer measurements stand behind the price: a regime priced worse
(several slices, experts) takes its MAPE where larger, a sequence longer than any published run of the
chip the largest error of its runs. Hand-made tables, so each figure is known."""

import pytest

from cost_models import accuracy
from cost_models.accuracy import error_band

pytestmark = pytest.mark.pure

TABLE = {
    "chips": {
        "v5p": {
            "corpus": {"step_time_mape": 0.07, "runs": 18, "max_abs_error": 0.21, "source": "corpus rows"},
            "cp_corpus": {"step_time_mape": 0.06, "runs": 30, "max_abs_error": 0.19, "source": "cp rows"},
            "longest_seq_len": 1 << 20,
        },
        "tpu7x": {"kernels": {"mape": 0.06, "calls": 72, "source": "kernel timings"}},
        "v5e": {
            "corpus": {"step_time_mape": 0.085, "runs": 24, "max_abs_error": 0.19, "source": "v5e rows"},
            "runtime": {
                "step_time_mape": 0.12,
                "runs": 62,
                "longest_seq_len": 262144,
                "source": "62 plans timed on the chip",
            },
            "longest_seq_len": 2048,
        },
    },
    "regimes": {
        "multislice": {
            "what": "over several slices",
            "step_time_mape": 0.131,
            "runs": 5,
            "max_abs_error": 0.231,
            "source": "5 multi-slice runs",
        },
        "experts": {
            "what": "with experts",
            "step_time_mape": 0.05,
            "runs": 6,
            "max_abs_error": 0.14,
            "source": "6 runs with experts",
        },
    },
}


@pytest.fixture(autouse=True)
def table(monkeypatch):
    monkeypatch.setattr(accuracy, "_table", lambda: TABLE)


def test_a_plan_within_what_was_measured_keeps_its_basis_band():
    band = error_band("v5p", context_parallel=True, seq_len=1 << 20)
    assert (band.relative, band.basis, band.widened) == (0.06, "cp_corpus", ())


def test_several_slices_take_the_multislice_runs_mape_where_larger():
    band = error_band("v5p", context_parallel=True, num_slices=2, seq_len=8192)
    assert band.relative == 0.131 and band.basis == "cp_corpus"
    assert band.widened == ("over several slices: MAPE over 5 published runs",)
    assert "widened to ±13.1%: over several slices: MAPE over 5 published runs" in band.describe()


def test_a_regime_measured_better_than_the_basis_does_not_narrow_it():
    band = error_band("v5p", context_parallel=False, experts=True, seq_len=8192)
    assert (band.relative, band.widened) == (0.07, ())


def test_a_sequence_longer_than_any_published_run_takes_the_largest_error_of_the_basis_runs():
    band = error_band("v5p", context_parallel=True, seq_len=4 << 20)
    assert band.relative == 0.19
    assert "no published v5p run is 4,194,304 tokens long (longest 1,048,576)" in band.describe()
    # both: the slices' MAPE first, then the longest-run rule where its figure is larger still
    both = error_band("v5p", context_parallel=False, num_slices=4, seq_len=4 << 20)
    assert both.relative == 0.21 and len(both.widened) == 2
    assert both.describe().startswith("±21.0% (no context parallelism plans: step-time MAPE over 18 published v5p")


def test_a_chip_checked_only_by_kernel_timings_widens_for_regimes_but_has_no_runs_for_length():
    band = error_band("tpu7x", context_parallel=False, num_slices=2, seq_len=4 << 20)
    assert band.basis == "kernels" and band.relative == 0.131 and len(band.widened) == 1


def test_cpplans_runtime_never_timed_on_a_chip_takes_the_largest_error_of_maxtexts_runs():
    band = error_band("v5p", context_parallel=True, seq_len=8192, runtime=True)
    assert band.relative == 0.19
    assert band.widened == (
        "cpplan's runtime was never timed on v5p (the published runs are MaxText's), so its own terms are "
        "unchecked and the largest error of those runs stands",
    )
    # on MaxText's step the basis stands
    assert error_band("v5p", context_parallel=True, seq_len=8192).relative == 0.06


def test_cpplans_runtime_timed_on_the_chip_takes_its_own_mape_where_larger():
    band = error_band("v5e", context_parallel=False, seq_len=2048, runtime=True)
    assert band.relative == 0.12 and band.widened == ("cpplan's runtime: MAPE over 62 plans timed on the chip",)
    # its longest timed plan counts for the runtime's length; MaxText's step has only the published runs
    assert error_band("v5e", context_parallel=False, seq_len=262144, runtime=True).relative == 0.12
    assert error_band("v5e", context_parallel=False, seq_len=262144).relative == 0.19
