"""cpplan's runtime: runs, trains and deviceless-compiles a `planner.Plan` on a JAX mesh with splash
attention, and times kernels and collectives. Public names load lazily: `import runtime` imports no jax.
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
