"""`validation.compiled_program.module_matmuls`, the module-text reading: matmul FLOPs of dots and of the
windowed convolutions the TPU compiler writes, times nested loop trip counts (stepped by 1 or
2), and the FLOPs of the instructions XLA's rematerialization cloned."""

from __future__ import annotations

import pytest

from validation.compiled_program import instruction_flops, loop_trip_counts, module_matmuls, parse_computations

pytestmark = pytest.mark.pure

# a layer loop of 3 (counter steps by 1) around a windowed-einsum loop of 8 steps taken 2 at a time;
# the layer body has a dot, its remat clone, and a convolution; a backend config spans lines
MODULE = """HloModule m

%fused_conv (p0: bf16[4,16], p1: bf16[16,8]) -> bf16[4,8] {
  %p0 = bf16[4,16]{1,0} parameter(0)
  %p1 = bf16[16,8]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[4,8]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%inner_cond (ip: (u32[])) -> pred[] {
  %ip = (u32[]) parameter(0)
  %bound = u32[] constant(8)
  %ic = u32[] get-tuple-element(%ip), index=0
  ROOT %lt.i = pred[] compare(%ic, %bound), direction=LT
}

%inner_body (ib: (u32[])) -> (u32[]) {
  %ib = (u32[]) parameter(0)
  %two = u32[] constant(2)
  %ibc = u32[] get-tuple-element(%ib), index=0
  %a = bf16[2,3]{1,0} parameter(1)
  %b = bf16[3,5]{1,0} parameter(2)
  %dot.in = bf16[2,5]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %next = u32[] add(%ibc, %two)
  ROOT %t.i = (u32[]) tuple(%next)
}

%outer_cond (op: (s32[], u32[])) -> pred[] {
  %op = (s32[], u32[]) parameter(0)
  %three = s32[] constant(3)
  %oc = s32[] get-tuple-element(%op), index=0
  ROOT %lt.o = pred[] compare(%oc, %three), direction=LT
}

%outer_body (ob: (s32[], u32[])) -> (s32[], u32[]) {
  %ob = (s32[], u32[]) parameter(0)
  %one = s32[] constant(1)
  %obc = s32[] get-tuple-element(%ob), index=0
  %x = bf16[4,16]{1,0} parameter(1)
  %w = bf16[16,8]{1,0} parameter(2)
  %dot.1 = bf16[4,8]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %dot.1.remat2 = bf16[4,8]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %conv_fusion.1 = bf16[4,8]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_conv, backend_config={"k":"a
\\"b\\": 1"
}, metadata={op_name="conv"}
  %zero = u32[] constant(0)
  %it = (u32[]) tuple(%zero)
  %inner = (u32[]) while(%it), condition=%inner_cond, body=%inner_body
  %next.o = s32[] add(%obc, %one)
  ROOT %t.o = (s32[], u32[]) tuple(%next.o, %zero)
}

ENTRY %main (e: s32[]) -> (s32[], u32[]) {
  %start = s32[] constant(0)
  %u0 = u32[] constant(0)
  %init = (s32[], u32[]) tuple(%start, %u0)
  ROOT %loop = (s32[], u32[]) while(%init), condition=%outer_cond, body=%outer_body
}
"""


def test_trip_counts_follow_the_counter_step():
    assert loop_trip_counts(MODULE) == {"inner_body": 4, "outer_body": 3}


def test_module_matmuls_multiply_nested_loops_and_find_remat_clones():
    counted = module_matmuls(MODULE)
    layer = 2 * 4 * 8 * 16  # one [4,16]x[16,8] matmul
    inner = 2 * 2 * 5 * 3
    assert counted["matmul_flops"] == 3 * (3 * layer + 4 * inner)
    assert counted["remat_matmul_flops"] == 3 * layer
    assert counted["remat_instructions"] == 1


def _convolution_flops(lhs: str, rhs: str, out: str, attributes: str) -> float:
    module = (
        f"HloModule m\n\nENTRY %main (lhs: {lhs}, rhs: {rhs}) -> {out} {{\n  %lhs = {lhs} parameter(0)\n"
        f"  %rhs = {rhs} parameter(1)\n  ROOT %conv = {out} convolution(%lhs, %rhs), {attributes}\n}}\n"
    )
    computations, entry = parse_computations(module)
    conv = computations[entry].by_name("conv")
    return instruction_flops(conv, computations[entry].shapes)


def test_padded_window_counts_only_real_inputs():
    # the TPU compiler's windowed reduce-scatter step: an input spatial size of 1 padded 1 each
    # side under a window of 2 gives 2 outputs, each reading the one real element once
    assert (
        _convolution_flops(
            "bf16[6,7,1]",
            "bf16[2,5,7]",
            "bf16[6,5,2]",
            "window={size=2 pad=1_1 rhs_reversal=1}, dim_labels=bf0_0oi->bf0",
        )
        == 2 * 6 * 5 * 7 * 2
    )
    # the heads broadcast: input spatial size 1 padded 7 each side under a window of 8 → 8 outputs
    assert (
        _convolution_flops(
            "bf16[3,10,1]",
            "bf16[10,8,4]",
            "bf16[3,8,4]",
            "window={size=8 pad=7_7 rhs_reversal=1}, dim_labels=bf0_i0o->b0f",
        )
        == 2 * 3 * 4 * 10 * 8
    )
