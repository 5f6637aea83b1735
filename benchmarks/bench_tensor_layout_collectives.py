"""Does MaxText's way of splitting the residual stream over `tensor` cost collectives that cpplan's
does not? A parallel decoder block (one norm, attention-like and MLP branches, their sum added
to the input), its tensor parallelism left to XLA's SPMD partitioner as MaxText leaves it, is
compiled deviceless for v5p:2x2x1 at tensor 4, forward and backward (gradients of weights and
input), with the residual split over `tensor` two ways:

- `embed`: by the embed dimension, as MaxText lays `activation_embed` (-> tensor) in its logical
  axis rules (AI-Hypercomputer/maxtext@76bd53b MaxText/configs/base.yml, the v5p corpus runs'
  commit; also 0.2.5), each branch output constrained to it (MaxText/layers/models.py DecoderLayer);
- `sequence`: by the sequence, as cpplan's runtime lays `RESIDUAL` (runtime/model.py).

Each is compiled without remat and with the block rematerialised (MaxText's `full`). Prints every
all-gather, reduce-scatter (XLA TPU writes them as `all-reduce-scatter` fusions) and all-reduce
outside those fusions, with its array.

    python benchmarks/bench_tensor_layout_collectives.py   # about 2 minutes for the four compiles here

What it showed (libtpu 0.0.52, 2026-12-01): both layouts make the same activation-sized
collectives, one gather of the normed input and one reduce-scatter of the summed branches forward,
their transposes backward, and one more gather per recomputation; the embed split adds only the
norm's per-token statistics, all-reduced over `tensor` (f32[batch, seq] forward and per
recomputation, bf16[batch, seq] backward): latency-sized, milliseconds per step for the v5p
corpus rows. It is no cause of their errors.

Results: benchmarks/results/tensor_layout_collectives.txt.
"""
import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

BATCH, SEQ, HIDDEN, WIDTH, TENSOR = 4, 2048, 1024, 4096, 4
COLLECTIVE = re.compile(r"= (\S+?)\{[^\n]*? (all-gather|all-reduce)(?:-start)?\(")


def collectives(*, split: str, remat: bool) -> list[str]:
    """The collectives of one block's forward and backward, as `kind array` strings."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = topologies.get_topology_desc(topology_name="v5p:2x2x1", platform="tpu").devices
    mesh = Mesh(np.array(devices).reshape(TENSOR), ("tensor",))
    residual = NamedSharding(mesh, P(None, None, "tensor") if split == "embed" else P(None, "tensor", None))
    columns = NamedSharding(mesh, P(None, None, "tensor"))

    def constrain(a, sharding):
        return jax.lax.with_sharding_constraint(a, sharding)

    def block(x, w_in_a, w_out_a, w_in_m, w_out_m):
        x = constrain(x, residual)
        normed = x * jax.lax.rsqrt(jnp.mean(x.astype(jnp.float32) ** 2, -1, keepdims=True) + 1e-5).astype(x.dtype)
        normed = constrain(normed, residual)
        branches = []
        for w_in, w_out in ((w_in_a, w_out_a), (w_in_m, w_out_m)):
            inner = constrain(jnp.einsum("bsd,df->bsf", normed, w_in), columns)
            branches.append(constrain(jnp.einsum("bsf,fd->bsd", jax.nn.relu(inner), w_out), residual))
        return constrain(branches[0] + branches[1] + x, residual)

    def loss(weights, x):
        run = jax.checkpoint(block) if remat else block
        return jnp.sum(run(x, *weights).astype(jnp.float32) ** 2)

    w_in = jax.ShapeDtypeStruct((HIDDEN, WIDTH), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, "tensor")))
    w_out = jax.ShapeDtypeStruct((WIDTH, HIDDEN), jnp.bfloat16, sharding=NamedSharding(mesh, P("tensor", None)))
    x = jax.ShapeDtypeStruct((BATCH, SEQ, HIDDEN), jnp.bfloat16, sharding=residual)
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower([w_in, w_out, w_in, w_out], x).compile().as_text()
    # a reduce-scatter is an `all-reduce-scatter` fusion whose body all-reduces: count the fusion, not its body
    found = [f"reduce-scatter {line.split(' = ')[1].split('{')[0]}" for line in text.splitlines()
             if "calls=%all-reduce-scatter" in line]
    for computation in text.split("\n\n"):
        header = computation.strip().split("\n", 1)[0]
        if header.startswith("%all-reduce-scatter"):
            continue
        found += [f"{kind} {array}" for array, kind in COLLECTIVE.findall(computation)]
    return sorted(found)


def main() -> int:
    for split in ("embed", "sequence"):
        for remat in (False, True):
            print(f"{split:8s} remat={'full' if remat else 'none':4s}: " + "; ".join(collectives(split=split, remat=remat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
