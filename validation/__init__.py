"""Validation: cpplan's predictions against what it measures, against the XLA TPU compiler, and
against runs imported from elsewhere; and the fits that turn measurements into a chip row.

The layer above `planner/` and `runtime/`: it may import both (the runtime only inside the
functions that measure, so reading a CSV or a report needs no jax).
"""
