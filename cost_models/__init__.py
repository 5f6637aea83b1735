"""cpplan's cost models: chips and topologies as cited data, model shapes, and the price
(FLOPs, HBM bytes, ICI time) of a training step under a plan. Never imports jax."""
