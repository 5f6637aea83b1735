"""Layers whose weight gradients are finished before the previous layer's backward starts, as a
layer loop orders them: steps whose loop the compiler peels (offloading) or inlines (one layer)
would otherwise reduce them at the step's end, against the memory price's phases.
Evidence: docs/provenance/runtime.md#layer-gradients.
"""

from __future__ import annotations

import flax.linen as nn
import jax


def gradients_finished_per_layer(layer: type[nn.Module], *, wait_for_cotangent: bool) -> type[nn.Module]:
    """`layer` (called as `layer(plan, mesh, experts, constants)(x, positions, segment_ids, mask_index)`), same call and
    parameters, whose backward hands on its input's gradient only with its weights' gradients; with
    `wait_for_cotangent` (one-layer steps that offload nothing) the backward also starts only once
    its output's gradient arrives, so its weight gathers are not hoisted to the step's top."""

    class GradientsFinishedPerLayer(nn.Module):
        plan: object
        mesh: object
        experts: bool = False
        constants: object = None  # the model's `runtime.model.ModelConstants`, passed on

        @nn.compact
        def __call__(self, x, positions, segment_ids=None, mask_index=None):
            def apply(module, x):
                return module(x, positions, segment_ids, mask_index)

            def forward(module, x):
                return nn.vjp(apply, module, x)

            def backward(vjp_fn, out_gradient):
                if wait_for_cotangent:  # the residuals (weights among them) are read only after this
                    vjp_fn, out_gradient = jax.lax.optimization_barrier((vjp_fn, out_gradient))
                # one barrier over all gradients: the input's cannot leave before the weights' are reduced
                return jax.lax.optimization_barrier(vjp_fn(out_gradient))

            ordered = nn.custom_vjp(apply, forward_fn=forward, backward_fn=backward)
            inner = layer(self.plan, self.mesh, self.experts, self.constants)
            # parameters where they would be unwrapped: a plan initialises the same whatever its remat policy
            nn.share_scope(self, inner)
            return ordered(inner, x)

    return GradientsFinishedPerLayer
