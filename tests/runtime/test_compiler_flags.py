"""cpplan's TPU compiler flags merged into a user's LIBTPU_INIT_ARGS (`runtime.compile`): the
user's flags win, cpplan's fill in the rest, and a real run's process gets them before libtpu starts.
Every TPU compile asks for the packed placement the memory price assumes (`PACKED_PLACEMENT_FLAG`)."""

import os

import pytest

from cost_models.pricing.memory import PACKED_PLACEMENT_FLAG
from runtime.compile import (
    TPU_COMPILER_FLAGS,
    USER_COMPILER_ARGS,
    child_environment,
    merged_compiler_args,
    use_compiler_flags,
    with_hlo_dump,
)

pytestmark = pytest.mark.pure

V5E = [*TPU_COMPILER_FLAGS["v5e"].split(), PACKED_PLACEMENT_FLAG]


def test_a_flag_the_user_set_keeps_the_users_value():
    user = "--xla_tpu_enable_async_collective_fusion=false --xla_jf_dump_to=/tmp/x"
    merged = merged_compiler_args(user, "v5e").split()
    assert merged[:2] == user.split()
    assert "--xla_tpu_enable_async_collective_fusion=true" not in merged  # cpplan's value of it dropped
    assert merged[2:] == [f for f in V5E if not f.startswith("--xla_tpu_enable_async_collective_fusion=")]
    assert len(merged) == 2 + len(V5E) - 1


def test_merging_is_idempotent_and_a_chip_without_flags_of_its_own_gets_the_placement_alone():
    once = merged_compiler_args("--xla_jf_dump_to=/tmp/x", "v5e")
    assert merged_compiler_args(once, "v5e") == once
    assert merged_compiler_args("", "v5e") == " ".join(V5E)
    # v5p and tpu7x schedule with libtpu's defaults
    assert merged_compiler_args(" --a=1  --b ", "v5p") == f"--a=1 --b {PACKED_PLACEMENT_FLAG}"
    assert merged_compiler_args("", "tpu7x") == PACKED_PLACEMENT_FLAG
    spatial = "--xla_tpu_buffer_assignment_algorithm=SPATIAL"
    assert merged_compiler_args(spatial, "v5p") == spatial  # the user's placement wins


def test_use_compiler_flags_sets_the_process_environment(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=false")
    use_compiler_flags("v5e")
    args = os.environ["LIBTPU_INIT_ARGS"].split()
    assert args[0] == "--xla_enable_async_all_gather=false" and "--xla_enable_async_all_gather=true" not in args
    assert set(V5E) - set(args) == {"--xla_enable_async_all_gather=true"}


def test_a_compile_for_another_chip_starts_again_from_the_users_flags(monkeypatch, tmp_path):
    """One process compiling for v5e and then v5p (here, or in a child) gives v5p the user's flags and its
    own, not v5e's set, which v5p's compiler refuses; flags the user sets in between are theirs from then on;
    a dump asked for in a child's environment survives the child's own call."""
    from planner import api

    user = "--xla_enable_async_all_gather=false"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", user)
    use_compiler_flags("v5e")
    assert os.environ[USER_COMPILER_ARGS] == user
    use_compiler_flags("v5p")
    assert os.environ["LIBTPU_INIT_ARGS"] == f"{user} {PACKED_PLACEMENT_FLAG}"
    plan = api.run_search("tiny", "4k", "v5p:2x2x1", global_batch_tokens=4096).ranked[0].plan
    assert plan.topology_spec.chip.name == "v5p" and plan.scoped_vmem_limit_kib is None
    use_compiler_flags("v5e")
    child = child_environment(plan)
    assert child["LIBTPU_INIT_ARGS"] == f"{user} {PACKED_PLACEMENT_FLAG}" and child[USER_COMPILER_ARGS] == user
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_other=1")  # the user's, set after cpplan wrote its own
    use_compiler_flags("v5p")
    assert os.environ["LIBTPU_INIT_ARGS"] == f"--xla_tpu_other=1 {PACKED_PLACEMENT_FLAG}"
    assert os.environ[USER_COMPILER_ARGS] == "--xla_tpu_other=1"
    dumping = with_hlo_dump(child, str(tmp_path))
    monkeypatch.setattr(os, "environ", dict(dumping))  # the child's process
    use_compiler_flags("v5p")
    assert f"--xla_jf_dump_to={tmp_path}" in os.environ["LIBTPU_INIT_ARGS"].split()


def test_the_cli_sets_them_before_it_measures_a_tpu_and_not_on_a_host(monkeypatch):
    """`cpplan calibrate/validate/run` on a TPU start jax with the chip's flags (they are set before
    the device check that starts the backend); on a host nothing is set."""
    from cost_models.topology import get_topology
    from runtime.launch import use_tpu_compiler_flags

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")  # so that teardown restores the variable as it was
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    use_tpu_compiler_flags(get_topology("cpu:8").chip)
    assert "LIBTPU_INIT_ARGS" not in os.environ
    use_tpu_compiler_flags(get_topology("v5e-16").chip)
    assert os.environ["LIBTPU_INIT_ARGS"].split() == V5E


def test_the_scoped_vmem_a_plan_needs_is_asked_per_compile_and_the_users_own_limit_wins(monkeypatch):
    """A plan whose splash blocks need more scoped VMEM than the compiler's default compiles with the
    chip's most (v5p: its VMEM, 65472 KiB; blocks of 2048 need 27.9M of its default 16M), asked for in
    each compile of its programs, never in the process's flags (`cpplan run` and `validate` compile
    plans of several block sizes in one process); none where its blocks fit the default, and none
    where the user's LIBTPU_INIT_ARGS set the limit. A child's deviceless compile gets the flag."""
    import dataclasses

    import planner
    from cost_models.compute import scoped_vmem_flag
    from cost_models.topology import get_topology
    from runtime.compile import plan_compiler_options
    from runtime.launch import use_tpu_compiler_flags

    plan = planner.plan("llama3.1-8b", "128k", "v5p-16", global_batch_tokens="128k")
    wide = dataclasses.replace(plan, block_q=2048, block_kv=2048)
    extra = scoped_vmem_flag(wide.scoped_vmem_limit_kib)
    assert extra == "--xla_tpu_scoped_vmem_limit_kib=65472"
    narrow = dataclasses.replace(plan, block_q=1024, block_kv=1024)
    assert scoped_vmem_flag(narrow.scoped_vmem_limit_kib) == ""
    assert merged_compiler_args("", "v5p", extra) == f"{PACKED_PLACEMENT_FLAG} {extra}"
    assert (
        merged_compiler_args("--xla_tpu_scoped_vmem_limit_kib=61440", "v5p", extra)
        == f"--xla_tpu_scoped_vmem_limit_kib=61440 {PACKED_PLACEMENT_FLAG}"
    )
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    use_tpu_compiler_flags(get_topology("v5p-16").chip)
    assert os.environ["LIBTPU_INIT_ARGS"] == PACKED_PLACEMENT_FLAG
    assert plan_compiler_options(wide) == {"xla_tpu_scoped_vmem_limit_kib": "65472"}
    assert plan_compiler_options(narrow) is None
    assert child_environment(wide)["LIBTPU_INIT_ARGS"] == f"{PACKED_PLACEMENT_FLAG} {extra}"
    assert child_environment(narrow)["LIBTPU_INIT_ARGS"] == PACKED_PLACEMENT_FLAG
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=61440")  # set by the user since
    assert plan_compiler_options(wide) is None


def test_calibrate_raises_the_limit_for_every_compile(monkeypatch):
    """`cpplan calibrate` times splash kernels of every block size in one process: the chip's most,
    in its flags."""
    from cost_models.topology import get_topology
    from runtime.launch import use_tpu_compiler_flags

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    use_tpu_compiler_flags(get_topology("v5p-16").chip, 65472)
    assert os.environ["LIBTPU_INIT_ARGS"] == f"{PACKED_PLACEMENT_FLAG} --xla_tpu_scoped_vmem_limit_kib=65472"
