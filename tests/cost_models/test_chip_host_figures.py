"""The TPU rows' host and network figures: each cited with its address, and stating the figure the row holds."""

import pytest

from cost_models.chips import known_chips
from cost_models.units import GiB

pytestmark = pytest.mark.pure

TPU_ROWS = [chip for chip in known_chips().values() if chip.kind.has_torus]


def _scientific(value: float) -> str:
    """1.6e10 as the sources write it ('1.6e10', not Python's '1.6e+10')."""
    mantissa, exponent = f"{value:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _stated_figures(chip) -> dict[str, str]:
    """The words each host or DCN source must contain: the row's own figure, per chip."""
    return {
        "host_memory_bytes_per_chip": f"{chip.host_memory_bytes_per_chip / GiB:g} GiB per chip",
        "host_link_bw_bytes_per_s": f"{_scientific(chip.host_link_bw_bytes_per_s)} B/s per chip",
        "dcn_bw_bytes_per_s": f"{_scientific(chip.dcn_bw_bytes_per_s)} B/s per chip",
    }


def test_there_are_tpu_rows_to_check():
    assert {chip.name for chip in TPU_ROWS} >= {"v5e", "v5p", "v6e", "tpu7x"}


@pytest.mark.parametrize("chip", TPU_ROWS, ids=lambda chip: chip.name)
def test_host_and_dcn_figures_cite_an_address_and_state_the_row_figure(chip):
    for field, figure in _stated_figures(chip).items():
        source = chip.sources.get(field, "")
        assert "https://" in source, f"{chip.name}.{field} cites no address: {source!r}"
        # a figure changed without its citation (or the reverse) no longer matches
        assert figure in source, f"{chip.name}.{field}: the source does not state the row's figure {figure!r}"


@pytest.mark.parametrize("chip", TPU_ROWS, ids=lambda chip: chip.name)
def test_host_figures_are_per_chip_in_the_right_units(chip):
    # every TPU VM has more RAM per chip than HBM, and its PCIe link is slower than one ICI link:
    # a figure per VM, per host, or in decimal GB where GiB was meant would break one of these
    devices = chip.devices_per_chip
    assert chip.host_memory_bytes_per_chip / devices > chip.hbm_bytes_per_device
    assert chip.host_memory_bytes_per_chip % GiB == 0, "Compute Engine lists VM memory in whole (binary) GB"
    assert chip.host_link_bw_bytes_per_s < chip.ici_link_bw_bytes_per_s < chip.hbm_bw_bytes_per_s
