"""The price of one training step (forward, backward, AdamW) for columns of candidates: one vectorised
implementation serves the search (thousands of rows) and a single plan (one row). Terms follow the
scaling book (T_math, T_hbm, T_comms) with explicit overlap; each part is a builder returning a frozen
dataclass (`matmul`, `attention`, `elementwise`, `head`, `memory`, `communication`), composed by `step.price`."""

from cost_models.pricing.memory import (
    LOSS_MEMORY,
    STATIC_MEMORY,
    UPDATE_MEMORY,
    backward_bytes,
    peak_bytes,
    update_bytes,
)
from cost_models.pricing.step import Priced, choose_rows, price, priced_rows

__all__ = [
    "LOSS_MEMORY",
    "STATIC_MEMORY",
    "UPDATE_MEMORY",
    "Priced",
    "backward_bytes",
    "choose_rows",
    "peak_bytes",
    "price",
    "priced_rows",
    "update_bytes",
]
