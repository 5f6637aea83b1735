"""Times one mixture-of-experts MLP of cpplan's runtime (`runtime.experts.mixture`) on the device this runs
on, forward and backward, whole and in parts, at a model's shapes: the whole MLP (route, permute, grouped
matmuls, unpermute and combine), its grouped matmuls alone (rows already sorted, the same group sizes),
and the rest (route, permute, unpermute and combine around an identity in place of the experts). Each is
jitted over a stack of chunks run one after another inside the program (`jax.lax.map`), so the time per
chunk holds no dispatch. Each timing is written to the output as it is made (one JSON line per part).

    python benchmarks/tpu_moe_layer.py --model benchmarks/tpu_v5e/mixtral-4l-e8.json --tokens 4096 \\
        --out benchmarks/results/tpu_v5e/moe_layer.jsonl
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

from tpu_grouped_matmul import timed  # noqa: E402  (its neighbour here: the same timing of a jitted call)

CHUNKS = 8  # chunks per program: the dispatch of one call spread over them


def parts(model, tokens: int) -> dict:
    """Each part's function of (x [chunks, tokens, hidden], weights) → a scalar, and its arguments."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh

    from runtime.experts import INPUT_NAMES, expert_weights, mixture, permute, route, unpermute_and_combine

    e = model.experts
    keys = iter(jax.random.split(jax.random.key(0), 16))
    shapes = {name: shape for name, (shape, _) in expert_weights(model).items()}
    weights = {n: jax.random.normal(next(keys), s, jnp.bfloat16) * s[-2] ** -0.5 for n, s in shapes.items()}
    x = jax.random.normal(next(keys), (CHUNKS, tokens, model.hidden), jnp.bfloat16)
    functions = (jax.nn.silu, lambda h: h)[: model.mlp_inputs]

    def whole(x, w):
        return mixture(x, w, experts=e, functions=functions)

    sizes = jnp.full((e.count,), tokens * e.per_token // e.count, jnp.int32)

    def grouped(x, w):  # the experts' matmuls over rows already in expert order
        rows = jnp.repeat(x, e.per_token, axis=0)
        inputs = [jax.lax.ragged_dot(rows, w[f"expert_{n}"], sizes) for n in INPUT_NAMES[len(functions)]]
        hidden = gated(inputs, functions)
        return jax.lax.ragged_dot(hidden, w["expert_w_down"], sizes)

    def rest(x, w):  # route, permute, unpermute and combine, the experts an identity
        probabilities, chosen = route(x, w["router"], None, per_token=e.per_token)
        rows, order, _, _ = permute(x, chosen, count=e.count)
        return unpermute_and_combine(rows, order, probabilities).astype(x.dtype)

    mesh = Mesh(jax.devices()[:1], ("tensor",))  # `mixture` reads its 'tensor' index

    def stepped(fn):
        def loss(x, w):
            def one(chunk):
                return jax.shard_map(
                    lambda c, ww: fn(c, ww), mesh=mesh, in_specs=(jax.P(), jax.P()), out_specs=jax.P(), check_vma=False
                )(chunk, w)

            return jnp.sum(jax.lax.map(one, x).astype(jnp.float32))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    return {name: (stepped(fn), (x, weights)) for name, fn in (("whole", whole), ("grouped", grouped), ("rest", rest))}


def gated(projections, functions):
    """act_0(h_0) · act_1(h_1) ⋯ of the input projections, as the runtime's gated MLP forms it."""
    out = None
    for h, act in zip(projections, functions):
        out = act(h) if out is None else out * act(h)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a model name or HF config.json with experts")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per chunk (the runtime's MLP chunk)")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per part")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    from cost_models.models import get_model

    model = get_model(args.model)
    if model.experts is None:
        parser.error(f"--model {args.model!r} has no experts: this times a mixture-of-experts MLP")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as log:
        for name, (fn, fn_args) in parts(model, args.tokens).items():
            seconds = timed(fn, fn_args, args.repeats) / CHUNKS
            row = {"model": model.name, "tokens": args.tokens, "part": name, "forward_backward_s": seconds}
            log.write(json.dumps(row) + "\n")
            log.flush()
            print(
                f"{model.name} {args.tokens} tokens {name:8} forward+backward {seconds * 1e3:8.3f} ms per chunk",
                flush=True,
            )


if __name__ == "__main__":
    main()
