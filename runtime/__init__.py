"""cpplan's runtime: runs a `planner.Plan` on a JAX mesh with the splash attention kernel,
trains it on one process or many (`runtime.loop`, with a pre-flight compile, checkpoints and
metrics), compiles it deviceless for TPU slices, and times kernels and collectives (`runtime.measure`).

It reads only `Plan` from the planner. The public names load lazily, so that `import runtime`
alone does not import jax.
"""
from importlib import import_module

_PUBLIC = {
    "build_mesh": "runtime.mesh",
    "context_attention": "runtime.attention",
    "sharded_attention": "runtime.attention",
    "run": "runtime.runner",
    "RunReport": "runtime.runner",
    "train": "runtime.loop",
    "preflight": "runtime.preflight",
    "compile_for": "runtime.compile",
    "CompileReport": "runtime.compile",
    "CompiledMemory": "runtime.compile",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
