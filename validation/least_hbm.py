"""The least HBM cap a step compiles under, found by bisection on the TPU compiler's HBM cap
(`xla_tpu_max_hbm_size_mib`): what bench_memory stores beside the unconstrained figure."""

from __future__ import annotations

import time

LEAST_HBM_RESOLUTION = 0.005  # the bisection stops when the failing and the fitting caps are this close
LEAST_HBM_PROBES = 10  # at most this many compiles a row, whatever the resolution reached


def hbm_needed(message: str) -> int | None:
    """The bytes a compiler's out-of-memory error says the step needed, or None if the error is not one."""
    from runtime.compile import parse_hbm_oom

    parsed = parse_hbm_oom(message)
    return parsed[0] if parsed else None


def least_cap(compile_under, *, unconstrained_bytes: int) -> dict:
    """The least HBM cap (MiB) under which `compile_under` compiles, bisected down from
    `unconstrained_bytes` (first probe at 90%), each probe's reported or needed bytes steering the next.

    Args:
        compile_under: cap MiB → `(fits, bytes)`: the memory held when it fits, else the error's need.
    Returns:
        `{"cap_mib", "failed_cap_mib", "compiled_bytes", "verified", "probes"}`; `verified` is False
        when the probes ran out first (`cap_mib` is then the compiler's own estimate).
    """
    from cost_models.units import GiB, MiB

    fits_at, fails_at = -(-unconstrained_bytes // MiB), 0  # caps in MiB (0: none has failed yet)
    fitted_bytes, probes = None, []
    cap = int(0.9 * unconstrained_bytes / MiB)
    while len(probes) < LEAST_HBM_PROBES:
        start = time.perf_counter()
        fits, reported = compile_under(cap)
        probes.append({"cap_mib": cap, "fits": fits, "bytes": reported, "compile_s": time.perf_counter() - start})
        print(
            f"    cap {cap} MiB: {'fits, holds' if fits else 'does not fit, needs'} {reported / GiB:.2f}G "
            f"({probes[-1]['compile_s']:.0f} s)",
            flush=True,
        )
        hint = -(-reported // MiB)
        step = LEAST_HBM_RESOLUTION * fits_at
        if fits:
            fits_at, fitted_bytes = cap, reported
        else:
            fails_at = cap
            if fails_at >= fits_at:  # not even the unconstrained figure: try what the compiler said it needs
                fits_at, fitted_bytes = max(hint, int(fails_at + step) + 1), None
        if fits_at - fails_at <= step:
            if fitted_bytes is not None:
                break
            cap = fits_at  # no cap at the upper end has compiled yet: check that it does
        elif fitted_bytes is None and hint >= fits_at - step:
            cap = fits_at  # the compiler says it needs the upper end: check that it fits there
        elif fails_at < hint < fits_at:
            cap = hint  # the figure the compiler named: where it is right, the bracket closes on it
        else:
            cap = (fails_at + fits_at) // 2 if fails_at else int(0.9 * fits_at)
    return {
        "cap_mib": fits_at,
        "failed_cap_mib": fails_at or None,
        "compiled_bytes": fitted_bytes,
        "verified": fitted_bytes is not None,
        "probes": probes,
    }


def least_hbm(plan, *, unconstrained_bytes: int) -> dict:
    """`least_cap` of the plan's step (which must fit), lowered once and compiled deviceless under
    `xla_tpu_max_hbm_size_mib`.

    Raises:
        jax.errors.JaxRuntimeError: the compiler failed other than for memory.
    """
    import jax

    from runtime.compile import CompiledMemory, lowered_step

    lowered = lowered_step(plan)

    def compile_under(cap_mib: int) -> tuple[bool, int]:
        try:
            compiled = lowered.compile(compiler_options={"xla_tpu_max_hbm_size_mib": cap_mib})
        except jax.errors.JaxRuntimeError as err:
            needed = hbm_needed(str(err))
            if needed is None:
                raise
            return False, needed
        return True, CompiledMemory.of(compiled).hbm_bytes_per_device

    return least_cap(compile_under, unconstrained_bytes=unconstrained_bytes)
