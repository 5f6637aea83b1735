"""The layers' import rules (README "Layout"), read from the source with `ast`, not by importing."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.pure
ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("cost_models", "planner", "runtime", "validation")
NUMERIC = {"numpy", "scipy", "networkx"}
JAX_STACK = {
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "tokamax",
    "orbax",
    "grain",
    "libtpu",
    "ml_dtypes",
    "numpy",
    "scipy",
    "tensorboardX",
    "tqdm",
    "safetensors",  # the runtime extra's Hugging Face checkpoints (runtime/hf_checkpoint.py)
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (inside functions too), as dotted names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; write the package name"
            # `from planner import api` imports planner.api; `from planner.plan import Plan` is planner.plan
            names.update(
                f"{node.module}.{alias.name}"
                if (ROOT / node.module.replace(".", "/") / f"{alias.name}.py").exists()
                or (ROOT / node.module.replace(".", "/") / alias.name).is_dir()
                else node.module
                for alias in node.names
            )
    return names


def allowed(layer: str, module: str) -> bool:
    """Whether a module of `layer` may import `module`."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "__future__" or top == layer:
        return True
    if layer == "cost_models":
        return top in NUMERIC
    if layer == "planner":
        return top in NUMERIC or top == "cost_models"
    if layer == "runtime":
        return (
            top in JAX_STACK or top == "cost_models" or module == "planner.plan" or module.startswith("planner.plan.")
        )
    return top != "cli"  # validation: anything but the CLI


def layer_files(layer: str) -> list[Path]:
    return sorted((ROOT / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", LAYERS)
def test_each_layer_imports_only_what_the_layout_allows(layer):
    files = layer_files(layer)
    assert files, f"no modules under {layer}/"
    broken = {
        f"{path.relative_to(ROOT)}: {module}"
        for path in files
        for module in imported_modules(path)
        if not allowed(layer, module)
    }
    assert not broken, "imports against the layout:\n" + "\n".join(sorted(broken))


def test_the_rules_catch_a_back_edge(tmp_path):
    """The checker itself can fail: a runtime module importing the planner's search is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from planner.plan import Plan\nfrom planner import api\nimport jax\n\ndef f():\n"
        "    from planner.search import search\n"
    )
    found = imported_modules(bad)
    assert {"planner.plan", "planner.api", "jax", "planner.search"} <= found
    assert [m for m in sorted(found) if not allowed("runtime", m)] == ["planner.api", "planner.search"]
    assert not allowed("planner", "jax") and not allowed("cost_models", "planner.plan")
    assert not allowed("validation", "cli") and allowed("validation", "runtime.measure")


def test_nothing_imports_the_cli():
    users = [
        str(p.relative_to(ROOT))
        for layer in LAYERS
        for p in layer_files(layer)
        if any(m.split(".")[0] == "cli" for m in imported_modules(p))
    ]
    assert not users


@pytest.mark.runtime_extra  # only where jax is installed can a stray import load it
def test_planning_never_imports_jax():
    """`import planner, cost_models` and a whole explanation load no jax (a laptop can plan)."""
    code = (
        "import sys, planner, cost_models, planner.maxtext, planner.suggest, cost_models.estimate; "
        "planner.explain('tiny', 1024, 'cpu:8'); "
        "bad = [m for m in sys.modules if m == 'jax' or m.startswith('jax.')]; "
        "sys.exit(f'jax imported: {bad}' if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.runtime_extra  # only where jax is installed can a stray import load it
def test_cpplan_explain_never_imports_jax():
    code = (
        "import sys, contextlib, io, cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    cli.main(['explain', '--model', 'tiny', '--seq-len', '1k', '--topology', 'cpu:8'])\n"
        "bad = [m for m in sys.modules if m == 'jax' or m.startswith('jax.')]\n"
        "sys.exit(f'jax imported: {bad}' if bad else 0)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
