"""Validation: cpplan's predictions against what it measures and against the XLA TPU compiler."""
