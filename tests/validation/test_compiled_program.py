"""The reader of XLA's scheduled HLO, on hand-written modules (pure; the price's counts against
compiled steps are in tests/runtime/test_compile.py)."""

import dataclasses
import math
import re

import pytest

from cost_models.counts import link_bytes
from cost_models.overlap import FAMILIES, overlap_for
from cost_models.strategies import STRATEGIES
from validation.compiled_program import (
    attribute,
    axis_groups,
    parse_computations,
    plan_layer_shares,
    read_compiled_program,
    replica_groups,
)

# A layer loop of 4 trips: a weight all-gather (sync, made in runtime/model.py), a ring
# collective-permute (async) with a matmul fusion scheduled between its start and done, and the
# module's stack-frame tables.
LOOP_MODULE = """HloModule jit_fn, is_scheduled=true

FileNames
1 "cpplan/runtime/model.py"
2 "cpplan/runtime/attention/ring.py"

FunctionNames
1 "swiglu.<locals>.local"
2 "_shift"

FileLocations
1 {file_name_id=1 function_name_id=1 line=112 end_line=112 column=1 end_column=9}
2 {file_name_id=2 function_name_id=2 line=32 end_line=32 column=1 end_column=9}

StackFrames
1 {file_location_id=1 parent_frame_id=1}
2 {file_location_id=2 parent_frame_id=2}

%fused_matmul (param_0: bf16[2048,256], param_1: bf16[256,512]) -> bf16[2048,512] {
  %param_0 = bf16[2048,256]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[256,512]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %convolution.1 = bf16[2048,512]{1,0:T(8,128)(2,1)} convolution(%param_0, %param_1), dim_labels=bf_io->bf, metadata={op_name="jit(fn)/dot_general"}
}

%body (p: (s32[], bf16[64,512], bf16[2048,256], bf16[4,2048,32])) -> (s32[], bf16[64,512], bf16[2048,256], bf16[4,2048,32]) {
  %p = (s32[], bf16[64,512]{1,0}, bf16[2048,256]{1,0}, bf16[4,2048,32]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %w = bf16[64,512]{1,0} get-tuple-element(%p), index=1
  %x = bf16[2048,256]{1,0} get-tuple-element(%p), index=2
  %kv = bf16[4,2048,32]{2,1,0} get-tuple-element(%p), index=3
  %all-gather.1 = bf16[256,512]{1,0:T(8,128)(2,1)} all-gather(%w), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true, metadata={op_name="jit(fn)/layers/shard_map/all_gather" stack_frame_id=1}
  %collective-permute-start.1 = (bf16[4,2048,32]{2,1,0:T(8,128)(2,1)S(1)}, bf16[4,2048,32]{2,1,0:T(8,128)(2,1)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%kv), channel_id=2, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}, metadata={op_name="jit(fn)/layers/shard_map/ppermute" stack_frame_id=2}
  %fusion.1 = bf16[2048,512]{1,0} fusion(%x, %all-gather.1), kind=kOutput, calls=%fused_matmul
  %collective-permute-done.1 = bf16[4,2048,32]{2,1,0:T(8,128)(2,1)} collective-permute-done(%collective-permute-start.1), metadata={op_name="jit(fn)/layers/shard_map/ppermute" stack_frame_id=2}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[64,512]{1,0}, bf16[2048,256]{1,0}, bf16[4,2048,32]{2,1,0}) tuple(%next, %w, %x, %collective-permute-done.1)
}

%cond (p.1: (s32[], bf16[64,512], bf16[2048,256], bf16[4,2048,32])) -> pred[] {
  %p.1 = (s32[], bf16[64,512]{1,0}, bf16[2048,256]{1,0}, bf16[4,2048,32]{2,1,0}) parameter(0)
  %counter = s32[] get-tuple-element(%p.1), index=0
  %four = s32[]{:T(128)} constant(4)
  ROOT %lt = pred[] compare(%counter, %four), direction=LT
}

ENTRY %main (a: bf16[64,512], b: bf16[2048,256], c: bf16[4,2048,32]) -> bf16[4,2048,32] {
  %a = bf16[64,512]{1,0} parameter(0)
  %b = bf16[2048,256]{1,0} parameter(1)
  %c = bf16[4,2048,32]{2,1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[64,512]{1,0}, bf16[2048,256]{1,0}, bf16[4,2048,32]{2,1,0}) tuple(%zero, %a, %b, %c)
  %while.1 = (s32[], bf16[64,512]{1,0}, bf16[2048,256]{1,0}, bf16[4,2048,32]{2,1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[4,2048,32]{2,1,0} get-tuple-element(%while.1), index=3
}
"""

# tpu7x's form: the collective runs on a SparseCore, started empty, handed its operand by an
# update, finished by a done; its computation closes with "}, execution_thread=...". A Mosaic
# kernel (custom-call) is scheduled after the update, a tensor all-reduce in the mesh form after.
SPARSECORE_MODULE = """HloModule jit_fn, is_scheduled=true

%called_computation.1 (param_0.1: f32[64,256]) -> f32[16,256] {
  %param_0.1 = f32[64,256]{1,0:T(8,128)} parameter(0)
  ROOT %reduce-scatter.1 = f32[16,256]{1,0:T(8,128)} reduce-scatter(%param_0.1), channel_id=3, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, to_apply=%add, metadata={op_name="jit(fn)/transpose(jvp())/shard_map/reduce_scatter"}
}, execution_thread="sparsecore"

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (g: f32[64,256], q: bf16[8,2048,128], h: bf16[2048,256]) -> (f32[16,256], bf16[8,2048,128], bf16[2048,256]) {
  %g = f32[64,256]{1,0} parameter(0)
  %q = bf16[8,2048,128]{2,1,0} parameter(1)
  %h = bf16[2048,256]{1,0} parameter(2)
  %rs.call-start = ((), (), (s32[8]{0})) custom-call-start(), async_execution_thread="sparsecore", called_computations={%called_computation.1}, custom_call_target="AsyncCall"
  %splash.0 = bf16[8,2048,128]{2,1,0} custom-call(%q), custom_call_target="tpu_custom_call", metadata={op_name="jit(fn)/pallas_call"}
  %rs.call-update = ((f32[64,256]{1,0}), f32[16,256]{1,0}, (s32[8]{0})) custom-call-update(%rs.call-start, %g)
  %splash.1 = bf16[8,2048,128]{2,1,0} custom-call(%splash.0), custom_call_target="tpu_custom_call", kernel_metadata={
"xprof_metadata":"{\\"block_q\\": 256}"
}}
  %rs.call-done = f32[16,256]{1,0} custom-call-done(%rs.call-update)
  %all-reduce.1 = bf16[2048,256]{1,0} all-reduce(%h), channel_id=4, replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, use_global_device_ids=true, to_apply=%add, metadata={op_name="jit(fn)/layers/shard_map/psum_invariant"}
  ROOT %out = (f32[16,256]{1,0}, bf16[8,2048,128]{2,1,0}, bf16[2048,256]{1,0}) tuple(%rs.call-done, %splash.1, %all-reduce.1)
}
"""

pytestmark = pytest.mark.pure


def test_sync_all_gather_in_a_loop_exact_bytes_executions_and_category():
    program = read_compiled_program(LOOP_MODULE)
    (gather,) = program.of(kind="all-gather")
    assert gather.array_bytes == 256 * 512 * 2  # the gathered result, bf16
    assert gather.group_size == 4 and gather.executions == 4 and gather.step_bytes == 4 * 256 * 512 * 2
    assert not gather.is_async and not gather.overlapped
    assert gather.category == "fsdp_all_gather"


def test_async_permute_sees_the_matmul_scheduled_before_its_done():
    program = read_compiled_program(LOOP_MODULE)
    (permute,) = program.of(kind="collective-permute")
    assert permute.is_async and permute.overlapped
    assert permute.category == "context"  # made in runtime/attention/, whatever its op_name
    assert permute.array_bytes == 4 * 2048 * 32 * 2 and permute.group_size == 2
    assert permute.flops_between == 2 * 2048 * 512 * 256  # the fusion's convolution, once per trip
    assert program.matmul_flops == 4 * 2 * 2048 * 512 * 256
    assert program.step_bytes(by="kind") == {
        "all-gather": 4 * 256 * 512 * 2,
        "collective-permute": 4 * 4 * 2048 * 32 * 2,
    }
    assert program.step_bytes() == {"fsdp_all_gather": 4 * 256 * 512 * 2, "context": 4 * 4 * 2048 * 32 * 2}


def test_sparsecore_collective_is_async_with_the_kernel_after_its_update():
    program = read_compiled_program(SPARSECORE_MODULE)
    (scatter,) = program.of(kind="reduce-scatter")
    assert scatter.is_async and scatter.overlapped
    assert scatter.array_bytes == 64 * 256 * 4  # the unreduced operand, fp32
    assert scatter.group_size == 4
    # splash.0 runs before the update hands over the operand; only splash.1 can hide the transfer
    assert scatter.kernels_between == ("tpu_custom_call",)
    assert scatter.category == "fsdp_reduce_scatter"
    assert program.custom_calls["tpu_custom_call"] == 2


def test_all_reduce_is_attributed_by_the_mesh_axes_it_runs_over():
    mesh = {"data": 1, "fsdp": 4, "context": 1, "context_ulysses": 1, "tensor": 2}
    (reduce,) = read_compiled_program(SPARSECORE_MODULE, mesh_axes=mesh).of(kind="all-reduce")
    assert reduce.group_size == 2
    assert replica_groups_of(SPARSECORE_MODULE, "all-reduce.1") == axis_groups(mesh, ("tensor",))
    assert reduce.category == "tensor"
    other_mesh = {"data": 1, "fsdp": 2, "context": 1, "context_ulysses": 1, "tensor": 4}  # tensor groups differ
    (reduce,) = read_compiled_program(SPARSECORE_MODULE, mesh_axes=other_mesh).of(kind="all-reduce")
    assert reduce.category == "other"


def replica_groups_of(text, name):
    computations, _ = parse_computations(text)
    return next(replica_groups(i) for c in computations.values() for i in c.instructions if i.name == name)


def test_replica_group_forms():
    assert replica_groups_of(SPARSECORE_MODULE, "reduce-scatter.1") == frozenset(
        {frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})}
    )
    assert replica_groups_of(LOOP_MODULE, "all-gather.1") == frozenset({frozenset({0, 1, 2, 3})})


def test_padded_window_convolution_counts_only_taps_on_the_input():
    """A matmul over heads written as a convolution with a padded window (as XLA writes the out
    projection's backward): 8 heads, window 8, pad 7 each side, 8 outputs: 36 of the 64 window
    positions land on the input; the padded ones multiply zeros and are not work."""
    module = """HloModule m, is_scheduled=true

ENTRY %main (a: bf16[2048,8,32], b: bf16[8,256,32]) -> bf16[2048,8,256] {
  %a = bf16[2048,8,32]{2,1,0} parameter(0)
  %b = bf16[8,256,32]{2,1,0} parameter(1)
  ROOT %convolution.1 = bf16[2048,8,256]{2,1,0} convolution(%a, %b), window={size=8 pad=7_7 rhs_reversal=1}, dim_labels=b0f_0oi->b0f
}
"""
    taps = sum(1 for o in range(8) for k in range(8) if 0 <= o + k - 7 < 8)
    assert taps == 36
    assert read_compiled_program(module).matmul_flops == 2 * 2048 * 256 * 32 * taps


def newer_printer(module: str) -> str:
    """The module as newer XLA prints it: a tuple's element named `%p#K` where it is used, no get-tuple-element
    (the entry's result, an instruction of its own, stays)."""
    gte = r"  %([\w.]+) = [^ ]+ get-tuple-element\((%[\w.]+)\), index=(\d+)\n"
    for name, tuple_name, index in re.findall(gte, module):
        if name != "out":
            module = re.sub(rf"  %{re.escape(name)} = [^\n]*\n", "", module)
            module = re.sub(rf"%{re.escape(name)}(?=[,)])", f"{tuple_name}#{index}", module)
    assert "get-tuple-element(%p" not in module and "%p#3" in module and "compare(%p.1#0" in module
    return module


def test_a_tuple_element_named_where_it_is_used_reads_as_its_get_tuple_element():
    """Newer XLA (jax 0.12's) writes `compare(%p#0, %four)` and `all-gather(%p#1)`: the loop's trips and
    each operand's bytes are its element's, not the whole tuple's."""
    older, newer = read_compiled_program(LOOP_MODULE), read_compiled_program(newer_printer(LOOP_MODULE))
    assert (
        newer.step_bytes(by="kind")
        == older.step_bytes(by="kind")
        == {
            "all-gather": 4 * 256 * 512 * 2,
            "collective-permute": 4 * 4 * 2048 * 32 * 2,
        }
    )
    assert newer.matmul_flops == older.matmul_flops == 4 * 2 * 2048 * 512 * 256
    (permute,) = newer.of(kind="collective-permute")
    assert permute.array_bytes == 4 * 2048 * 32 * 2  # the element's, not the tuple's (which adds 64×512 and more)


def test_a_tuple_elements_shape_is_read_past_layouts_tilings_comments_and_nested_tuples():
    shape = (
        "(s32[], bf16[4,2048]{1,0:T(8,128)(2,1)}, (f32[2]{0}, s8[3]), u32[]{:S(2)}, bf16[1]{0}, "
        "/*index=5*/f32[7,8]{1,0:T(8,128)S(1)})"
    )
    (add,) = [
        i
        for c in parse_computations(f"""HloModule m

ENTRY %main (p: {shape}) -> f32[7,8] {{
  %p = {shape} parameter(0)
  ROOT %a = f32[7,8]{{1,0}} add(%p#5, %p#5)
}}
""")[0].values()
        for i in c.instructions
        if i.opcode == "add"
    ]
    assert add.operands == ("p", "p") and add.elements == (5, 5)
    shapes = {"p": shape}
    assert add.operand_shape(0, shapes) == "f32[7,8]{1,0:T(8,128)S(1)}"
    assert [dataclasses.replace(add, elements=(k,)).operand_shape(0, shapes) for k in range(7)] == [
        "s32[]",
        "bf16[4,2048]{1,0:T(8,128)(2,1)}",
        "(f32[2]{0}, s8[3])",
        "u32[]{:S(2)}",
        "bf16[1]{0}",
        "f32[7,8]{1,0:T(8,128)S(1)}",
        "",  # past the tuple's end
    ]


def test_loop_without_a_counted_condition_is_refused():
    with pytest.raises(ValueError, match="trip"):
        read_compiled_program(LOOP_MODULE.replace("direction=LT", "direction=NE"))


def test_link_bytes_are_the_price_formulas_at_one_byte_per_second():
    assert link_bytes("all-gather", 1000.0, 4) == pytest.approx(750.0)
    assert link_bytes("all-reduce", 1000.0, 4) == pytest.approx(1500.0)
    assert link_bytes("all-to-all", 1000.0, 4) == pytest.approx(1000.0)
    assert link_bytes("collective-permute", 1000.0, 2) == pytest.approx(1000.0)


def test_overlap_file_covers_the_tpus_and_falls_back_on_the_chip_row():
    for chip in ("v5p", "tpu7x", "v5e", "v6e"):
        overlap = overlap_for(chip, assumed_overlap=True)
        assert overlap.source.startswith("compiled")
        assert all(0.0 <= overlap.of(f) <= 1.0 for f in FAMILIES)
        assert set(overlap.context) == {spec.name for spec in STRATEGIES.values()}
    host = overlap_for("cpu", assumed_overlap=False)
    assert host.source.startswith("assumed") and not any(host.families.values())
    # a family no compile made (data = 1 in every plan) takes the row's assumption
    assert overlap_for("v6e", assumed_overlap=True).of("data_all_reduce") == 1.0
    assert overlap_for("v6e", assumed_overlap=False).of("data_all_reduce") == 0.0
    assert not math.isnan(overlap_for("tpu7x", assumed_overlap=True).of_context("ring"))


# An asynchronous all-gather (the start/done pair XLA's continuation fusion makes) with only a
# copy between its start and done, then one with a matmul fusion between; a synchronous all-reduce
# with the same matmul right after it. Only the second gather can hide: 2 of the module's 3
# collectives move bytes asynchronously, 1 of them with compute to hide behind.
ASYNC_GATHER_MODULE = """HloModule jit_fn, is_scheduled=true

%fused_matmul (param_0: bf16[512,256], param_1: bf16[256,256]) -> bf16[512,256] {
  %param_0 = bf16[512,256]{1,0} parameter(0)
  %param_1 = bf16[256,256]{1,0} parameter(1)
  ROOT %convolution.1 = bf16[512,256]{1,0} convolution(%param_0, %param_1), dim_labels=bf_io->bf
}

%add (x: bf16[], y: bf16[]) -> bf16[] {
  %x = bf16[] parameter(0)
  %y = bf16[] parameter(1)
  ROOT %s = bf16[] add(%x, %y)
}

ENTRY %main (w: bf16[64,256], v: bf16[64,256], x: bf16[512,256]) -> (bf16[512,256], bf16[512,256]) {
  %w = bf16[64,256]{1,0} parameter(0)
  %v = bf16[64,256]{1,0} parameter(1)
  %x = bf16[512,256]{1,0} parameter(2)
  %all-gather-start.1 = (bf16[64,256]{1,0}, bf16[256,256]{1,0}) all-gather-start(%w), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %copy.1 = bf16[512,256]{0,1} copy(%x)
  %all-gather-done.1 = bf16[256,256]{1,0} all-gather-done(%all-gather-start.1)
  %all-gather-start.2 = (bf16[64,256]{1,0}, bf16[256,256]{1,0}) all-gather-start(%v), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %fusion.1 = bf16[512,256]{1,0} fusion(%x, %all-gather-done.1), kind=kOutput, calls=%fused_matmul
  %all-gather-done.2 = bf16[256,256]{1,0} all-gather-done(%all-gather-start.2)
  %all-reduce.1 = bf16[512,256]{1,0} all-reduce(%fusion.1), channel_id=3, replica_groups=[2,2]<=[4], to_apply=%add
  %fusion.2 = bf16[512,256]{1,0} fusion(%all-reduce.1, %all-gather-done.2), kind=kOutput, calls=%fused_matmul
  ROOT %out = (bf16[512,256]{1,0}, bf16[512,256]{1,0}) tuple(%fusion.2, %copy.1)
}
"""


def test_async_gather_overlaps_only_with_compute_between_its_start_and_done():
    program = read_compiled_program(ASYNC_GATHER_MODULE)
    first, second = program.of(kind="all-gather")
    (reduce,) = program.of(kind="all-reduce")
    assert first.is_async and not first.overlapped  # a copy is no compute to hide behind
    assert first.compute_between == () and first.array_bytes == 256 * 256 * 2
    assert second.is_async and second.overlapped and second.compute_between == ("fusion.1",)
    assert second.flops_between == 2 * 512 * 256 * 256
    assert not reduce.is_async and not reduce.overlapped  # the matmul after a sync op hides nothing
    # the fractions fit_overlap writes: bytes asynchronous, and overlapped, of all moved
    moved = sum(c.step_bytes for c in program.collectives)
    assert sum(c.step_bytes for c in program.collectives if c.overlapped) / moved == pytest.approx(
        256 * 256 * 2 / (2 * 256 * 256 * 2 + 512 * 256 * 2)
    )


def test_overlap_data_was_compiled_with_the_flags_the_runtime_compiles_with():
    """What the price reads is what runs: each chip's rows record the compiler flags that shaped the
    schedule they were read from, and those are the runtime's for that chip today (the packed
    placement every compile also asks for places buffers in the schedule made, and changes none)."""
    from cost_models.overlap import _data
    from runtime.compile import TPU_COMPILER_FLAGS

    data = _data()
    assert set(data["provenance"]) == set(data["chips"])
    for chip, made in data["provenance"].items():
        assert made["compiler_flags"] == (TPU_COMPILER_FLAGS.get(chip) or "libtpu's defaults"), chip


def test_runtime_compiler_flags_are_added_once_after_the_callers_own():
    from cost_models.pricing.memory import PACKED_PLACEMENT_FLAG
    from runtime.compile import TPU_COMPILER_FLAGS, with_compiler_flags

    env = with_compiler_flags({"LIBTPU_INIT_ARGS": "--xla_jf_dump_to=dump"}, "v5e")
    assert env["LIBTPU_INIT_ARGS"] == f"--xla_jf_dump_to=dump {TPU_COMPILER_FLAGS['v5e']} {PACKED_PLACEMENT_FLAG}"
    assert with_compiler_flags(env, "v5e") == env
    assert with_compiler_flags({}, "v5p")["LIBTPU_INIT_ARGS"] == PACKED_PLACEMENT_FLAG  # v5p schedules by default


# v5e's continuation fusion (MaxText's flags): one weight all-gather (channel 7) runs as a start
# fusion, a matmul fusion carrying a step of it, and a done fusion, each holding a copy of the
# all-gather; a second gather (channel 8) stays synchronous. As XLA's TPU compiler prints it
# (shapes cut down).
CHAIN_MODULE = """HloModule jit_fn, is_scheduled=true

%fused_start (p0: bf16[64,256]) -> (bf16[64,256], bf16[256,256], u32[]) {
  %p0 = bf16[64,256]{1,0} parameter(0)
  %all-gather.1 = bf16[256,256]{1,0} all-gather(%p0), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %custom-call.1 = (bf16[64,256]{1,0}, bf16[256,256]{1,0}, u32[]) custom-call(%all-gather.1), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.1 (q0: bf16[64,256], q1: bf16[256,256], q2: u32[], x: bf16[512,256], y: bf16[256,256]) -> (bf16[512,256], bf16[64,256], bf16[256,256], u32[]) {
  %q0 = bf16[64,256]{1,0} parameter(0)
  %q1 = bf16[256,256]{1,0} parameter(1)
  %q2 = u32[] parameter(2)
  %x = bf16[512,256]{1,0} parameter(3)
  %y = bf16[256,256]{1,0} parameter(4)
  %convolution.1 = bf16[512,256]{1,0} convolution(%x, %y), dim_labels=bf_io->bf
  %all-gather.2 = bf16[256,256]{1,0} all-gather(%q0), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %tuple.1 = (bf16[512,256]{1,0}, bf16[64,256]{1,0}, bf16[256,256]{1,0}, u32[]) tuple(%convolution.1, %q0, %q1, %q2)
}

%fused_done (r0: bf16[64,256], r1: bf16[256,256], r2: u32[]) -> bf16[256,256] {
  %r0 = bf16[64,256]{1,0} parameter(0)
  %r1 = bf16[256,256]{1,0} parameter(1)
  %r2 = u32[] parameter(2)
  %all-gather.3 = bf16[256,256]{1,0} all-gather(%r0), channel_id=7, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true, frontend_attributes={chain_id="0"}
  ROOT %custom-call.2 = bf16[256,256]{1,0} custom-call(%r0, %r1, %all-gather.3, %r2), custom_call_target="AsyncCollectiveDone"
}

ENTRY %main (w: bf16[64,256], v: bf16[64,256], x: bf16[512,256], y: bf16[256,256]) -> (bf16[256,256], bf16[256,256], bf16[512,256]) {
  %w = bf16[64,256]{1,0} parameter(0)
  %v = bf16[64,256]{1,0} parameter(1)
  %x = bf16[512,256]{1,0} parameter(2)
  %y = bf16[256,256]{1,0} parameter(3)
  %async-collective-start = (bf16[64,256]{1,0}, bf16[256,256]{1,0}, u32[]) fusion(%w), kind=kCustom, calls=%fused_start
  %s0 = bf16[64,256]{1,0} get-tuple-element(%async-collective-start), index=0
  %s1 = bf16[256,256]{1,0} get-tuple-element(%async-collective-start), index=1
  %s2 = u32[] get-tuple-element(%async-collective-start), index=2
  %fusion.1 = (bf16[512,256]{1,0}, bf16[64,256]{1,0}, bf16[256,256]{1,0}, u32[]) fusion(%s0, %s1, %s2, %x, %y), kind=kOutput, calls=%async_collective_fusion.1
  %t0 = bf16[64,256]{1,0} get-tuple-element(%fusion.1), index=1
  %t1 = bf16[256,256]{1,0} get-tuple-element(%fusion.1), index=2
  %t2 = u32[] get-tuple-element(%fusion.1), index=3
  %mm = bf16[512,256]{1,0} get-tuple-element(%fusion.1), index=0
  %async-collective-done = bf16[256,256]{1,0} fusion(%t0, %t1, %t2), kind=kCustom, calls=%fused_done
  %all-gather.4 = bf16[256,256]{1,0} all-gather(%v), channel_id=8, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  ROOT %out = (bf16[256,256]{1,0}, bf16[256,256]{1,0}, bf16[512,256]{1,0}) tuple(%async-collective-done, %all-gather.4, %mm)
}
"""


def test_continuation_fusion_chain_is_one_async_gather_hidden_by_the_matmul_carrying_its_step():
    program = read_compiled_program(CHAIN_MODULE)
    chained, plain = program.of(kind="all-gather")  # three copies of the chained gather count once
    assert chained.name == "async-collective-start" and chained.is_async and chained.overlapped
    assert chained.array_bytes == 256 * 256 * 2 and chained.group_size == 4
    assert chained.compute_between == ("fusion.1",) and chained.flops_between == 2 * 512 * 256 * 256
    assert not plain.is_async and not plain.overlapped
    assert program.matmul_flops == 2 * 512 * 256 * 256  # the step's matmul counted once
    # half the gathered bytes of the step overlap: the fraction fit_overlap writes for this family
    assert (
        sum(c.step_bytes for c in program.collectives if c.overlapped) / sum(c.step_bytes for c in program.collectives)
        == 0.5
    )


# A layer loop of 6 trips around the runtime's switch between a layer's masks: the global branch makes three
# ring hops (collective-permutes of 4 × 1024 × 32 bf16), a matmul and a nested per-hop `cond` (the ring's
# hop direction) of two kernels; the local branch one hop and a smaller matmul.
SWITCH_MODULE = """HloModule jit_fn, is_scheduled=true

%past_kernel (a.p: bf16[4,1024,32]) -> bf16[4,1024,32] {
  %a.p = bf16[4,1024,32]{2,1,0} parameter(0)
  ROOT %kernel.p = bf16[4,1024,32]{2,1,0} custom-call(%a.p), custom_call_target="tpu_custom_call"
}

%future_kernel (a.f: bf16[4,1024,32]) -> bf16[4,1024,32] {
  %a.f = bf16[4,1024,32]{2,1,0} parameter(0)
  ROOT %kernel.f = bf16[4,1024,32]{2,1,0} custom-call(%a.f), custom_call_target="tpu_custom_call"
}

%global_branch (p.g: (bf16[4,1024,32], bf16[1024,256], bf16[256,512])) -> bf16[4,1024,32] {
  %p.g = (bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %kv.g = bf16[4,1024,32]{2,1,0} get-tuple-element(%p.g), index=0
  %x.g = bf16[1024,256]{1,0} get-tuple-element(%p.g), index=1
  %w.g = bf16[256,512]{1,0} get-tuple-element(%p.g), index=2
  %mm.g = bf16[1024,512]{1,0} convolution(%x.g, %w.g), dim_labels=bf_io->bf
  %cp.1 = bf16[4,1024,32]{2,1,0} collective-permute(%kv.g), channel_id=1, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(fn)/layers/layers.attention/cond/branch_0_fun/shard_map/ppermute"}
  %cp.2 = bf16[4,1024,32]{2,1,0} collective-permute(%cp.1), channel_id=2, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(fn)/layers/layers.attention/cond/branch_0_fun/shard_map/ppermute"}
  %cp.3 = bf16[4,1024,32]{2,1,0} collective-permute(%cp.2), channel_id=3, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(fn)/layers/layers.attention/cond/branch_0_fun/shard_map/ppermute"}
  %past = s32[] constant(0)
  ROOT %hop = bf16[4,1024,32]{2,1,0} conditional(%past, %cp.3, %cp.3), branch_computations={%past_kernel, %future_kernel}, metadata={op_name="jit(fn)/layers/layers.attention/cond/branch_0_fun/shard_map/cond"}
}

%local_branch (p.l: (bf16[4,1024,32], bf16[1024,256], bf16[256,512])) -> bf16[4,1024,32] {
  %p.l = (bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %kv.l = bf16[4,1024,32]{2,1,0} get-tuple-element(%p.l), index=0
  %x.l = bf16[1024,256]{1,0} get-tuple-element(%p.l), index=1
  %w.l = bf16[256,128]{1,0} constant({...})
  %mm.l = bf16[1024,128]{1,0} convolution(%x.l, %w.l), dim_labels=bf_io->bf
  ROOT %cp.4 = bf16[4,1024,32]{2,1,0} collective-permute(%kv.l), channel_id=4, source_target_pairs={{0,1},{1,0}}, metadata={op_name="jit(fn)/layers/layers.attention/cond/branch_1_fun/shard_map/ppermute"}
}

%body (p: (s32[], bf16[4,1024,32], bf16[1024,256], bf16[256,512])) -> (s32[], bf16[4,1024,32], bf16[1024,256], bf16[256,512]) {
  %p = (s32[], bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %kv = bf16[4,1024,32]{2,1,0} get-tuple-element(%p), index=1
  %x = bf16[1024,256]{1,0} get-tuple-element(%p), index=2
  %w = bf16[256,512]{1,0} get-tuple-element(%p), index=3
  %args = (bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) tuple(%kv, %x, %w)
  %switch = bf16[4,1024,32]{2,1,0} conditional(%i, %args, %args), branch_computations={%global_branch, %local_branch}, metadata={op_name="jit(fn)/jvp(Llama)/while/body/closed_call/layers/layers.attention/cond"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) tuple(%next, %switch, %x, %w)
}

%cond (p.1: (s32[], bf16[4,1024,32], bf16[1024,256], bf16[256,512])) -> pred[] {
  %p.1 = (s32[], bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) parameter(0)
  %counter = s32[] get-tuple-element(%p.1), index=0
  %six = s32[] constant(6)
  ROOT %lt = pred[] compare(%counter, %six), direction=LT
}

ENTRY %main (a: bf16[4,1024,32], b: bf16[1024,256], c: bf16[256,512]) -> bf16[4,1024,32] {
  %a = bf16[4,1024,32]{2,1,0} parameter(0)
  %b = bf16[1024,256]{1,0} parameter(1)
  %c = bf16[256,512]{1,0} parameter(2)
  %zero = s32[] constant(0)
  %init = (s32[], bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) tuple(%zero, %a, %b, %c)
  %while.1 = (s32[], bf16[4,1024,32]{2,1,0}, bf16[1024,256]{1,0}, bf16[256,512]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = bf16[4,1024,32]{2,1,0} get-tuple-element(%while.1), index=1
}
"""
HOP_BYTES = 4 * 1024 * 32 * 2
GLOBAL_FLOPS, LOCAL_FLOPS = 2 * 1024 * 512 * 256, 2 * 1024 * 128 * 256


def test_the_layer_switch_counts_each_branch_in_its_share_of_the_layers():
    # two of six layers global (three hops each), four local (one hop each)
    program = read_compiled_program(SWITCH_MODULE, layer_shares=(1 / 3, 2 / 3))
    assert [c.executions for c in program.of(kind="collective-permute")] == pytest.approx([2, 2, 2, 4])
    assert program.step_bytes()["context"] == pytest.approx((2 * 3 + 4 * 1) * HOP_BYTES)
    assert program.matmul_flops == pytest.approx(2 * GLOBAL_FLOPS + 4 * LOCAL_FLOPS)
    # the ring's per-hop cond inside the global branch: one of its kernels a hop, counted as before
    assert program.custom_calls["tpu_custom_call"] == pytest.approx(2 * 2)
    # without the shares every branch counts whole, as every layer took both; the FLOPs the costlier's
    whole = read_compiled_program(SWITCH_MODULE)
    assert whole.step_bytes()["context"] == 6 * (3 + 1) * HOP_BYTES
    assert whole.matmul_flops == 6 * GLOBAL_FLOPS
    with pytest.raises(ValueError, match="layer switch switch has 2 branches, but the plan's model has 3"):
        read_compiled_program(SWITCH_MODULE, layer_shares=(0.2, 0.3, 0.5))


def test_a_plans_layer_shares_follow_its_models_layer_masks():
    from types import SimpleNamespace

    from cost_models.models import MODELS

    mixed = dataclasses.replace(MODELS["small"], num_layers=6, window=300, layer_pattern="LLG")
    assert plan_layer_shares(SimpleNamespace(model=mixed)) == pytest.approx((1 / 3, 2 / 3))  # global first
    assert plan_layer_shares(SimpleNamespace(model=MODELS["gemma3-12b"])) == pytest.approx((1 / 6, 5 / 6))
    assert plan_layer_shares(SimpleNamespace(model=MODELS["small"])) is None  # one mask: no switch


@pytest.mark.parametrize(
    "op_name, computation, category",
    [
        # the loop bodies of XLA's windowed einsum say which collective their permutes stand for
        (
            "jit(fn)/jvp(Llama)/layers/bsd,dhk->bshk/dot_general",
            "wide.windowed_dot_general_body_ag.1.clone.sunk",
            "fsdp_all_gather",
        ),
        (
            "jit(fn)/transpose(jvp(Llama))/layers/bsd,dhk->bshk/dot_general",
            "wide.windowed_dot_general_body_rs.2.clone",
            "fsdp_reduce_scatter",
        ),
        # a peeled step: the backward's weight gradient scatters, a forward or recomputed projection gathers
        (
            "jit(fn)/transpose(jvp(Llama))/checkpoint/layers/bsd,dhk->bshk/dot_general",
            "wide.region_18.48_spmd",
            "fsdp_reduce_scatter",
        ),
        (
            "jit(fn)/transpose(jvp(Llama))/checkpoint/rematted_computation/layers/dot_general",
            "region_18",
            "fsdp_all_gather",
        ),
        ("jit(fn)/jvp(Llama)/layers/bsd,dhk->bshk/dot_general", "region_1.12", "fsdp_all_gather"),
        # the ring's own permutes stay the strategy's
        ("jit(fn)/jvp(Llama)/layers/shard_map/ppermute", "region_1.12", "context"),
    ],
)
def test_a_windowed_einsums_permutes_count_as_the_weight_collective_they_replace(op_name, computation, category):
    assert (
        attribute("collective-permute", op_name=op_name, stack=[], dtypes={"bf16"}, computation=computation) == category
    )
    ring = [("runtime/attention/ring.py", "_shift")]
    assert (
        attribute("collective-permute", op_name=op_name, stack=ring, dtypes={"bf16"}, computation=computation)
        == "context"
    )


def test_a_sparsecore_computation_ends_where_its_thread_is_named():
    """TPU7x closes a SparseCore computation with `}, execution_thread="sparsecore"`: the computation after
    it is its own, not glued onto the last instruction."""
    from validation.compiled_program import one_line_per_instruction

    text = (
        "%sc_body (p: f32[8]) -> f32[8] {\n"
        "  %p = f32[8]{0} parameter(0)\n"
        "  ROOT %g = f32[64]{0} all-gather(%p), dimensions={0}\n"
        '}, execution_thread="sparsecore"\n'
        "\n"
        "ENTRY %next (q: f32[8]) -> f32[8] {\n"
        "  ROOT %q = f32[8]{0} parameter(0)\n"
        "}\n"
    )
    lines = one_line_per_instruction(text).splitlines()
    assert '}, execution_thread="sparsecore"' in lines
    assert any(line.startswith("ENTRY %next") for line in lines)
