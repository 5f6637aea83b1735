"""Layers whose weight gradients are finished before the previous layer's backward starts.

Inside a layer loop each iteration finishes its own layer's weight gradients. Outside one nothing
makes a layer's backward finish them: the compiler finishes and reduces them at the step's end, next
to the optimizer's update that reads them, and holds their inputs and unreduced partial sums through
the later layers' backward (benchmarks/results/bench_memory_offload.md). Two kinds of step have no
layer loop to give that order:
- a step that offloads activations to host memory: the TPU compiler peels its layer loops (the host
  writes are pipelined across iterations; with two layers the loops of one trip left are inlined);
- a step of one layer: XLA inlines a loop of one trip. Its reduce-scatters of the layer's weight
  gradients then run beside the output head's update (a deviceless tpu7x compile, with the head's
  gradient then stacked by vocabulary piece and the update's buffers the step's largest, held them
  there unreduced: 0.23 GiB at tensor 2, 0.46 GiB at tensor 1).
Tying a layer's weight gradients to its input's gradient restores what the loop gives, and the
memory price's phases (one layer's backward at a time; the update with every gradient reduced) hold.

A loop's iteration also starts its backward only when its output's gradient arrives. Outside one,
the backward's weight gathers depend on nothing but the parameters, and the scheduler starts them at
the step's top and holds them through the loss (a deviceless tpu7x compile of a one-layer fsdp 8
step: the MLP's weights gathered in two layouts, 6 x 112 MiB). `wait_for_cotangent` ties the
layer's residuals to that gradient as the loop does. It is for steps that offload nothing: in an
offloading step the same tie also changes which offloaded values come back and when (a v5p
one-layer `minimal_offloaded` step drops from 3.92 to 3.63 GiB, and its price, 4.05, to +11.8%),
which the offload price, shared with MaxText, does not describe.
"""
from __future__ import annotations

import flax.linen as nn
import jax


def gradients_finished_per_layer(layer: type[nn.Module], *, wait_for_cotangent: bool) -> type[nn.Module]:
    """`layer` (a module class called as `layer(plan, mesh)(x, positions, segment_ids)`) whose
    backward hands its input's gradient on only together with its weights' gradients.

    Args:
        layer: the decoder layer class (rematerialised already, if it is).
        wait_for_cotangent: whether its backward also starts only when its output's gradient has
            arrived (for a one-layer step that offloads nothing).
    Returns:
        A module class with the same call and the same parameters, to be stacked with `nn.scan`
        in its place.
    """

    class GradientsFinishedPerLayer(nn.Module):
        plan: object
        mesh: object

        @nn.compact
        def __call__(self, x, positions, segment_ids=None):
            def apply(module, x):
                return module(x, positions, segment_ids)

            def forward(module, x):
                return nn.vjp(apply, module, x)

            def backward(vjp_fn, out_gradient):
                if wait_for_cotangent:  # the residuals (weights among them) are read only after this
                    vjp_fn, out_gradient = jax.lax.optimization_barrier((vjp_fn, out_gradient))
                # one barrier over every gradient the layer hands back: the input's cannot leave
                # before the weights' have been computed and reduced
                return jax.lax.optimization_barrier(vjp_fn(out_gradient))

            ordered = nn.custom_vjp(apply, forward_fn=forward, backward_fn=backward)
            inner = layer(self.plan, self.mesh)
            # the layer's parameters (and the random streams that initialise them) where they would
            # be without this wrapper, so a plan initialises the same whatever its remat policy
            nn.share_scope(self, inner)
            return ordered(inner, x)

    return GradientsFinishedPerLayer
