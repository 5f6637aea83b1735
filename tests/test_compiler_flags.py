"""cpplan's TPU compiler flags merged into a user's LIBTPU_INIT_ARGS (`runtime.compile`): the
user's flags win, cpplan's fill in the rest, and a real run's process gets them before libtpu starts."""
import os

import pytest

from runtime.compile import TPU_COMPILER_FLAGS, merged_compiler_args, use_compiler_flags

pytestmark = pytest.mark.pure

V5E = TPU_COMPILER_FLAGS["v5e"].split()


def test_a_flag_the_user_set_keeps_the_users_value():
    user = "--xla_tpu_enable_async_collective_fusion=false --xla_jf_dump_to=/tmp/x"
    merged = merged_compiler_args(user, "v5e").split()
    assert merged[:2] == user.split()
    assert "--xla_tpu_enable_async_collective_fusion=true" not in merged  # cpplan's value of it dropped
    assert merged[2:] == [f for f in V5E if not f.startswith("--xla_tpu_enable_async_collective_fusion=")]
    assert len(merged) == 2 + len(V5E) - 1


def test_merging_is_idempotent_and_a_chip_without_flags_keeps_the_users():
    once = merged_compiler_args("--xla_jf_dump_to=/tmp/x", "v5e")
    assert merged_compiler_args(once, "v5e") == once
    assert merged_compiler_args("", "v5e") == " ".join(V5E)
    assert merged_compiler_args(" --a=1  --b ", "v5p") == "--a=1 --b"  # v5p compiles with libtpu's defaults
    assert merged_compiler_args("", "v5p") == ""


def test_use_compiler_flags_sets_the_process_environment(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=false")
    use_compiler_flags("v5e")
    args = os.environ["LIBTPU_INIT_ARGS"].split()
    assert args[0] == "--xla_enable_async_all_gather=false" and "--xla_enable_async_all_gather=true" not in args
    assert set(V5E) - set(args) == {"--xla_enable_async_all_gather=true"}
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    use_compiler_flags("v5p")
    assert "LIBTPU_INIT_ARGS" not in os.environ


def test_the_cli_sets_them_before_it_measures_a_tpu_and_not_on_a_host(monkeypatch):
    """`cpplan calibrate/validate/run` on a TPU start jax with the chip's flags (they are set before
    the device check that starts the backend); on a host nothing is set."""
    import cli
    from cost_models.topology import get_topology

    monkeypatch.setenv("LIBTPU_INIT_ARGS", "")  # so that teardown restores the variable as it was
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    cli._use_tpu_compiler_flags(get_topology("cpu:8"))
    assert "LIBTPU_INIT_ARGS" not in os.environ
    cli._use_tpu_compiler_flags(get_topology("v5e-16"))
    assert os.environ["LIBTPU_INIT_ARGS"].split() == V5E
