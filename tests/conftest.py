"""Test set-up: 8 virtual CPU devices, set before anything imports jax (the cpu_mesh tier)."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
