"""The precision of a step's matmuls and the peak it answers to: bf16, or fp8 inputs (MaxText's
`quantization=fp8_full`) on a chip whose row gives an fp8 peak. One rule, read by the search (which refuses
fp8 on a chip without it), the price and the MaxText flags in and out."""

from __future__ import annotations

from cost_models.topology import Topology
from cost_models.vocabulary import Quantization


def fp8_refusal(topology: Topology, quantization: Quantization) -> str | None:
    """Why `topology`'s chip cannot run `quantization` (None: it can)."""
    if quantization is Quantization.NONE or topology.chip.peak_fp8_flops_per_s > 0:
        return None
    return (
        f"quantization={quantization.value}: chip {topology.chip.name} has no fp8 matmul peak in its row "
        f"(peak_fp8_flops_per_s=0: {topology.chip.sources.get('peak_fp8_flops_per_s', 'no fp8 unit cited')}); "
        f"price it in bf16 (quantization=none)"
    )


def matmul_peak_flops(topology: Topology, quantization: Quantization) -> float:
    """FLOP/s one device's MXUs peak at in `quantization`'s precision: the chip row's bf16 peak, or its fp8
    peak under fp8 (each split over the chip's devices).

    Raises:
        ValueError: fp8 on a chip without an fp8 peak (the search refuses such plans first, `fp8_refusal`).
    """
    if quantization is Quantization.NONE:
        return topology.peak_flops_per_device
    refusal = fp8_refusal(topology, quantization)
    if refusal:
        raise ValueError(refusal)
    return topology.chip.peak_fp8_flops_per_s / topology.devices_per_chip
