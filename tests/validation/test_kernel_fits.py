"""The kernel fits: recovered from timings built by hand, reproduced by the rows, host unchanged."""

import json
from pathlib import Path

import pytest
from grouped_fit_script import grouped_fit_script

from cost_models.chips import CHIP_DIR, load_chip
from validation import kernel_fits as fit_kernels

pytestmark = pytest.mark.pure

# v5p per device: 459 TFLOP/s, 2.76e12 B/s of HBM, 128×128 MXUs
PEAK, HBM_BW = 459e12, 2.76e12
EFFICIENCY, STEP_S, MASKED_S, PASSES = 0.8, 2e-7, 5e-13, 3.0
BACKWARD_RATIO, BACKWARD_PASSES = 2.2, 2.0
BLOCK = 512
SHAPES = [
    (batch, seq, heads, dim, causal)
    for batch, seq in ((32, 512), (8, 2048), (2, 8192))
    for heads, dim in ((16, 128), (8, 256), (32, 64))
    for causal in (False, True)
]


def _hand_times(batch, seq, heads, dim, causal):
    """(forward, backward) seconds of one call, written out from the model's definition."""
    blocks = seq / BLOCK
    pairs = seq * seq * ((blocks + 1) / (2 * blocks) if causal else 1.0)
    padded_dim = max(dim, 128)  # head_dim 64 fills half of a 128-wide MXU
    math = 4 * batch * heads * padded_dim * pairs / (PEAK * EFFICIENCY)
    steps = batch * heads * blocks * blocks
    masked = batch * heads * seq * BLOCK if causal else 0
    array = batch * seq * heads * dim * 2  # bf16, as many kv heads as q heads
    forward = math + STEP_S * steps + MASKED_S * masked + PASSES * 4 * array / HBM_BW
    # backward: tokamax's VJP is splash's fused kernel, one grid; its passes are over the operands of
    # the dq kernel's q, dO, dq | k, v and the dk/dv kernel's q, dO | k, v, dk, dv; its fp32 dq
    # partials, one per key block, are read back by their sum, which it writes (in bf16 units, 2×)
    partials = (blocks + 1) * 2 * array
    backward = (
        BACKWARD_RATIO * math + STEP_S * steps + MASKED_S * masked + (BACKWARD_PASSES * 11 * array + partials) / HBM_BW
    )
    return forward, backward


def _timing_file(path: Path, *, backward: bool) -> None:
    entries = {}
    for batch, seq, heads, dim, causal in SHAPES:
        call = {
            "q": f"bf16[{batch},{seq},{heads},{dim}]",
            "k": f"bf16[{batch},{seq},{heads},{dim}]",
            "v": f"bf16[{batch},{seq},{heads},{dim}]",
            "bias": None,
            "mask": {"is_causal": causal},
            "return_residuals": not backward,
        }
        config = {"block_q_dkv": BLOCK, "block_kv_dkv": BLOCK} if backward else {"block_q": BLOCK, "block_kv": BLOCK}
        if backward:
            call["dout"] = call["q"]
        seconds = _hand_times(batch, seq, heads, dim, causal)[backward]
        # a slower config alongside: the fit takes each call's fastest
        entries[json.dumps(call)] = {
            json.dumps(config): {"evaluation_times_ms": [seconds * 1e3] * 3},
            json.dumps({**config, "slow": 1}): {"evaluation_times_ms": [seconds * 2e3]},
        }
    path.write_text(json.dumps(entries))


def test_the_fit_recovers_figures_from_timings_made_by_hand(tmp_path):
    _timing_file(tmp_path / "forward.json", backward=False)
    _timing_file(tmp_path / "backward.json", backward=True)
    chip = load_chip(CHIP_DIR / "v5p.json")
    forward = fit_kernels.read_attention(tmp_path / "forward.json", backward=False)
    assert len(forward) == len(SHAPES)
    fit, rms = fit_kernels.fit_forward(chip, forward)
    assert rms < 1e-6
    assert (fit.efficiency, fit.step_s, fit.masked_element_s, fit.operand_passes) == pytest.approx(
        (EFFICIENCY, STEP_S, MASKED_S, PASSES), rel=1e-4
    )
    ratio, passes, rms = fit_kernels.fit_backward(
        chip, fit, fit_kernels.read_attention(tmp_path / "backward.json", backward=True)
    )
    assert rms < 1e-6
    assert (ratio, passes) == pytest.approx((BACKWARD_RATIO, BACKWARD_PASSES), rel=1e-4)


def _ragged_dot(lhs, rhs, groups, **extra):
    return json.dumps(
        {
            "lhs": lhs,
            "rhs": rhs,
            "group_sizes": groups,
            "return_residuals": False,
            "ragged_dot_dimension_numbers": {
                "dot_dimension_numbers": [[[1], [1]], [[], []]],
                "lhs_ragged_dimensions": [0],
                "rhs_group_dimensions": [0],
            },
            **extra,
        }
    )


def test_dense_matmul_rates_by_hand(tmp_path):
    """Dense-size calls are kept with their FLOPs over the median time; small groups, narrow widths,
    residuals and quantized weights are not layer matmuls."""
    entries = {
        _ragged_dot("bf16[8192,4096]", "bf16[8,4096,14336]", [1024] * 8): [2.0, 1.0, 4.0],
        _ragged_dot("bf16[4096,4096]", "bf16[8,4096,4096]", [4096] + [0] * 7): [0.5],  # one group: a dense matmul
        _ragged_dot("bf16[8192,4096]", "bf16[8,4096,14336]", [512] * 16): [0.1],  # groups too small
        _ragged_dot("bf16[131072,4096]", "bf16[128,4096,512]", {"num_groups": 128, "total_size": 131072}): [
            0.1
        ],  # narrow
        _ragged_dot("bf16[8192,4096]", "bf16[8,4096,14336]", [1024] * 8, return_residuals=True): [0.1],
        _ragged_dot("bf16[8192,4096]", "bf16[8,4096,14336]", [1024] * 8, rhs_scale="bf16[8,1,1,14336]"): [0.1],
    }
    (tmp_path / "pallas_mosaic_tpu_ragged_dot.json").write_text(
        json.dumps({key: {"{}": {"evaluation_times_ms": times}} for key, times in entries.items()})
    )
    equal, single = fit_kernels.read_dense_matmuls(tmp_path / "pallas_mosaic_tpu_ragged_dot.json")
    assert equal.flops_per_s == pytest.approx(2 * 8192 * 4096 * 14336 / 2e-3)  # the median of three times
    assert single.flops_per_s == pytest.approx(2 * 4096**3 / 0.5e-3)
    assert (single.group_rows, single.rows, single.intensity) == (4096, 4096, pytest.approx(4096 / 3))


def test_matmul_efficiency_is_the_best_rate_and_the_spread_the_matmul_bound_ones():
    chip = load_chip(CHIP_DIR / "v5p.json")  # 459 TFLOP/s over 2.76 TB/s: a ridge of 166 FLOP/B

    def timing(rows, width, seconds):
        return fit_kernels.MatmulTiming(
            kernel="k",
            lhs="",
            rhs="",
            groups="",
            group_rows=rows,
            rows=rows,
            contract=width,
            out=width,
            seconds=seconds,
        )

    bound = [timing(4096, 4096, 2 * 4096**3 / (e * PEAK)) for e in (0.5, 0.9)]
    # 512 rows by 1024²: 256 FLOP/B, under twice the ridge: it sets the best but is not in the spread
    shallow = timing(512, 1024, 2 * 512 * 1024**2 / (0.95 * PEAK))
    efficiency, best, spread = fit_kernels.dense_matmul_efficiency(chip, [*bound, shallow])
    assert efficiency == pytest.approx(0.95) and best is shallow
    assert spread == pytest.approx([0.5, 0.9])
    assert fit_kernels.dense_matmul_efficiency(chip, [])[1] is None


def _installed_tokamax_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("tokamax")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tokamax is not installed (the runtime extra carries it)")


def _installed_tokamax_as_cited():
    """Skips unless the installed tokamax is the release whose data the TPU7x attention row cites."""
    version = _installed_tokamax_version()
    cited = load_chip(CHIP_DIR / "tpu7x.json").sources["attention_efficiency"]
    if f"tokamax {version} " not in cited:
        pytest.skip(f"the installed tokamax {version} is not the release the attention rows were fitted to")


@pytest.mark.runtime_extra
def test_rows_hold_what_the_installed_timings_give():
    """A row cannot drift from its data: refitting from the installed tokamax gives each figure whose
    source cites that release (releases carry different timings: the attention rows cite 0.0.12, the
    matmul efficiencies 0.0.17, so each stack checks its own)."""
    version = _installed_tokamax_version()
    base = fit_kernels.installed_dir()
    derived = fit_kernels.derive([], base)
    # the grouped-matmul figures have their own fit, from the same release's ragged dots
    grouped = (
        grouped_fit_script().derive(base) if (base / "tpu7x" / "pallas_mosaic_tpu_v2_ragged_dot.json").exists() else {}
    )
    checked, cited = [], set()
    for name in fit_kernels.DEVICE_DIRS:
        row = load_chip(CHIP_DIR / f"{name}.json")
        cited |= {(name, field) for field, source in row.sources.items() if f"tokamax {version} " in source}
        figures = {**derived[name]["figures"], **grouped.get(name, {}).get("figures", {})}
        for field, value in figures.items():
            if f"tokamax {version} " in row.sources[field]:
                assert getattr(row, field) == value, (name, field)
                checked.append((name, field))
    if not cited:
        pytest.skip(f"no chip row cites the installed tokamax {version}")
    assert set(checked) == cited  # every figure a row cites from that release is one the refit gives


@pytest.mark.runtime_extra
def test_fitted_rows_meet_the_kernel_target():
    """MAPE at 4096 tokens and over within 10% on the installed timings (TPU7x, both directions)."""
    _installed_tokamax_as_cited()
    derived = fit_kernels.derive([], fit_kernels.installed_dir())
    for direction in ("forward", "backward"):
        pairs = [
            (model, t.seconds)
            for d, t, model, _ in derived["tpu7x"]["comparison"]
            if d == direction and t.seq >= fit_kernels.LONG
        ]
        assert pairs and fit_kernels.mape(pairs) <= 10.0, direction


KEPT_COPY_S = 0.0033554432


def test_host_predictions_are_unchanged():
    """cpu:8 estimates as they were before the kernel fields (previous model's 2.5 and 0 passes),
    each plan priced at the 512-token splash blocks the search used then, with full remat
    recomputing the MLP's gate and up but not its down projection, which no backward reads, and the
    context and embedding traffic following the compiled programs (ring and USP). On top of these,
    the ring's merges of its calls are priced: per layer, forward (run twice under full remat) merges ×
    q values × (4 + 4 + 2) bytes, backward merges × 12 × (q values + 2 × kv values), at the host's
    1.25e9 B/s over 4 layers: ring 4 zigzag (3 merges, 1 sequence of 8 × 1024 × 32 query and
    4 × 1024 × 32 key values) 4 × (2 × 7864320 + 18874368) B = 0.1107296256 s; USP 2 × 4 on shared
    cores (0.5 merges, 2 sequences of 2 × 2048 × 32 and 1 × 2048 × 32) 0.0184549376 s. And, as the
    backward sends K/V round the ring again instead of reusing the recomputed forward's, the
    recomputed forward's hops: ring 4 layers × 3 hops × (131072 B / 1.25e9 B/s + 60 µs) =
    0.0019782912 s; USP 4 layers × its one hop's exposed forward, 0.0004994304 s. And the layer loop's copy
    of full remat's kept layer input into the layer stack, read and written: 4 layers × 1024 tokens × 256 ×
    2 B × 2 / 1.25e9 B/s = 0.0033554432 s."""
    import dataclasses

    from planner.api import run_search
    from planner.estimate import estimate

    before = {
        "ring": ({"context": 4, "fsdp": 2}, 10.121329387520001),
        "ulysses": ({"context_ulysses": 4, "fsdp": 2}, 10.12085166592),
        "all_gather": ({"context": 4, "fsdp": 2}, 10.11869166592),
        "usp": ({"context": 2, "context_ulysses": 4}, 10.12414881792),
    }
    merges = {"ring": 0.1107296256, "usp": 0.0184549376}
    recomputed_hops = {"ring": 0.0019782912, "usp": 0.0004994304}
    for strategy, (mesh, step_s) in before.items():
        full = {axis: mesh.get(axis, 1) for axis in ("data", "fsdp", "context", "context_ulysses", "tensor")}
        balance = "zigzag" if strategy in ("ring", "all_gather") else "none"
        plan = (
            run_search(
                "small",
                4096,
                "cpu:8",
                mesh=full,
                strategies=[strategy],
                global_batch=2,
                remat="full",
                load_balance=balance,
            )
            .ranked[0]
            .plan
        )
        priced = estimate(dataclasses.replace(plan, block_q=512, block_kv=512))
        merge_s = merges.get(strategy, 0.0)
        hops_s = recomputed_hops.get(strategy, 0.0)
        assert priced.step_time_s == pytest.approx(step_s + merge_s + hops_s + KEPT_COPY_S, rel=1e-12), strategy
        assert priced.compute_s["attention"] == pytest.approx(6.95784701952 + merge_s, rel=1e-12), strategy
