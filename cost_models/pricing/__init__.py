"""The price of one training step (forward, backward, AdamW) for columns of candidates.

One vectorised implementation serves both the search (thousands of candidates as numpy
columns) and a single plan (one row). Terms follow the scaling book: T_math (MXU work, tile
padding and splash block waste included), T_hbm (elementwise work and the optimizer, bandwidth
bound), T_comms per collective; overlap is explicit: ring hops hide behind the attention of the
block in hand, FSDP gathers behind the previous layer, both within one budget (the layer's
compute, counted once); the rest is exposed.

Each part is a builder returning a small frozen dataclass (`matmul`, `attention`,
`elementwise`, `head`, `memory`, `communication`); `step.price` composes them.
"""
from cost_models.pricing.memory import (LAYER_MEMORY, LOSS_MEMORY, STATIC_MEMORY, UPDATE_MEMORY, backward_bytes,
                                         peak_bytes, update_bytes)
from cost_models.pricing.step import Priced, price

__all__ = ["LAYER_MEMORY", "LOSS_MEMORY", "STATIC_MEMORY", "UPDATE_MEMORY", "Priced", "backward_bytes", "peak_bytes",
           "price", "update_bytes"]
