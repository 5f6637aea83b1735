"""Units and the one definition of model FLOPs utilisation, shared by prices and measurements."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30


def counted(n: int, noun: str) -> str:
    """'1 chip', '8 chips': a count with its noun in the number it takes."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def mfu(model_flops: float, step_time_s: float, num_devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilisation: the step's model FLOPs (as MaxText counts them, all devices together) over
    what the devices could do at peak in the step time."""
    return model_flops / (step_time_s * num_devices * peak_flops_per_device)
