"""Price the MaxText config you run today, then export cpplan's choice back to MaxText flags.

Run: python examples/maxtext_config.py
"""

from cost_models.units import GiB
from planner import Plan, explain
from planner.estimate import estimate
from planner.maxtext import format_flags

# A MaxText 0.2.5 run as docs/measurements.md compiled it: Llama 3.1 8B, 256K tokens, ring over 8 v5p chips.
today = (
    "compile_topology=v5p-16 model_name=llama3.1-8b max_target_length=262144 per_device_batch_size=0.125 "
    "remat_policy=full ici_fsdp_parallelism=1 ici_context_parallelism=8 context_parallel_strategy=ring "
    "use_tokamax_splash=True"
)
current = Plan.from_maxtext(today)
priced = estimate(current)
print(
    f"your config:  step {priced.step_time_s:.2f} s, MFU {priced.mfu:.1%}, "
    f"HBM {priced.hbm_bytes_per_device / GiB:.1f} GiB per device (fits: {priced.fits})"
)

choice = explain(current.model, current.seq_len, current.topology, global_batch_tokens=current.seq_len)
best = choice.estimate
print(
    f"cpplan's plan: step {best.step_time_s:.2f} s, MFU {best.mfu:.1%}, "
    f"HBM {best.hbm_bytes_per_device / GiB:.1f} GiB per device "
    f"({priced.step_time_s / best.step_time_s:.2f}x faster)"
)
print("MaxText flags:", format_flags(choice.best.to_maxtext()))
