"""How much of a lone call's timing is the host's dispatch, on the chip this runs on: calibrate's layer
matmuls and its elementwise pass, each timed call by call (dispatch, wait, repeat) and as
`runtime.measure.best_time` times them (calls dispatched back to back, one wait). The difference per
call is the latency a lone timing adds, which a step's program does not pay between its ops.

    python benchmarks/tpu_dispatch_latency.py [TOPOLOGY]   # on a TPU VM (default v5e:1x1); a line per call
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's runtime, uninstalled

LONE_CALLS = 20  # at least this many lone calls timed, the fastest kept


def main() -> None:
    from cost_models.topology import get_topology
    from runtime import measure
    from validation.kernel_calibration import MEMORY_VALUES, ModelDims, model_matmuls

    topo = get_topology(sys.argv[1] if len(sys.argv) > 1 else "v5e:1x1")
    mesh = measure.device_mesh(topo)
    d = ModelDims()
    calls = [
        (
            f"matmul {m}x{k}·{k}x{n}",
            measure.per_device_call(mesh, lambda a, b: a @ b[0], ((m, k), "bfloat16"), ((1, k, n), "bfloat16")),
        )
        for m, k, n in model_matmuls(d.hidden, d.heads, d.kv_heads, d.head_dim, d.intermediate)
    ]
    calls.append(
        (
            f"x*1.5+0.5 over {MEMORY_VALUES} bf16",
            measure.per_device_call(mesh, lambda x: x * 1.5 + 0.5, ((MEMORY_VALUES,), "bfloat16")),
        )
    )
    for name, (fn, arrays) in calls:
        lone = measure.best_time(fn, *arrays, repeats=LONE_CALLS, back_to_back=False)
        batched = measure.best_time(fn, *arrays, repeats=5)
        dispatch_us = (lone - batched) * 1e6
        print(f"{name:36s} lone {lone * 1e3:7.3f} ms  batched {batched * 1e3:7.3f} ms  dispatch {dispatch_us:5.0f} µs")


if __name__ == "__main__":
    main()
