#!/usr/bin/env bash
# The tests, exactly as CI runs them (.ci/run calls this script and nothing else), in three stages:
#   1. Python 3.11 with `pip install -e '.[test,report]'` (no jax): ruff's lint and format check, then
#      the pure tier, which passes without jax (the HTML reports and their browser test included).
#   2. Python 3.11 with the runtime extra: the rest of the suite (cpu_mesh, tpu_compile, and the
#      pure tests that mean something only with that extra installed, marked runtime_extra); the
#      rest of the pure tier already ran in stage 1 and does not import jax, so it is not run twice;
#      the cases marked release_subset are stage 3's smaller stand-ins, left out here.
#   3. Python 3.12 with MaxText 0.2.5's stack (constraints/maxtext-0.2.5.txt): cpu_mesh and
#      runtime_extra (less seven files whose outcome does not depend on the jax release, see STAGE3_IGNORE,
#      and the cases marked release_repeat, whose jax calls another case of their test makes).
# Each stage installs into its own virtual environment under .venvs/ (kept for the next run); all
# three run, and a summary at the end gives each one's outcome and time.
# Run from anywhere: `bash scripts/test.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

# A Python of the given minor version: pyenv's when pyenv has one (it need not be the active
# version), otherwise python3.X on the PATH.
python_for() {
    local version
    if command -v pyenv >/dev/null; then
        version=$(pyenv versions --bare | grep -E "^$1\.[0-9]+$" | sort -V | tail -1)
        if [ -n "$version" ]; then echo "$(pyenv root)/versions/$version/bin/python$1"; return; fi
    fi
    command -v "python$1" || { echo "Python $1 not found: install it (e.g. 'pyenv install $1')" >&2; exit 1; }
}

# uv installs a stage's packages in seconds where pip takes a minute or more (most of a stage's set-up);
# pip installs uv where it is missing, and where it cannot, pip installs the packages itself.
UV=$(command -v uv || { python3 -m pip install -q uv >/dev/null 2>&1 && command -v uv; } || true)

# venv NAME PYTHON PIP-ARGS...: (re)uses .venvs/NAME and installs this checkout into it.
venv() {
    local dir=".venvs/$1"
    if [ -n "$UV" ]; then
        { [ -x "$dir/bin/python" ] || "$UV" venv -q -p "$2" "$dir"; } && VIRTUAL_ENV="$dir" "$UV" pip install -q -e "${@:3}"
    else
        { [ -x "$dir/bin/python" ] || "$2" -m venv "$dir"; } && "$dir/bin/python" -m pip install -q -e "${@:3}"
    fi
}

# tier NAME PYTEST-ARGS...: runs pytest in .venvs/NAME; collecting no test is a failure, not a pass.
# Tests run in one worker per core (pytest-xdist), a file's tests in one worker, so a file's shared
# fixtures are built once; the slowest tests are listed at the end of each stage.
tier() {
    local status=0
    ".venvs/$1/bin/python" -m pytest -q -p no:cacheprovider -n auto --dist loadfile --durations=15 "${@:2}" ||
        status=$?
    if [ "$status" -eq 5 ]; then echo "FAILED: pytest ${*:2} collected no tests in .venvs/$1" >&2; fi
    return "$status"
}

# One persistent jax compilation cache for this run, empty at its start and removed at its end: the
# suite compiles the same step many times over (every `cpplan run` subprocess of the resume, fault and
# example tests compiles the tiny model's step again), and a hit returns the executable the compiler
# made earlier in this run. Fresh each run, so the time measured here is what a clean CI clone takes.
JAX_COMPILATION_CACHE_DIR=$(mktemp -d)
export JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=1

# Python's bytecode likewise, in a directory of this run's: where the environment sets
# PYTHONDONTWRITEBYTECODE (and uv installs without bytecode), every process (a stage's workers, every
# `cpplan` and MaxText subprocess) compiled jax's and MaxText's sources again, 2 s or more each and a
# quarter of the subprocess-heavy tests' time. A prefix outside the checkout keeps the tree clean.
PYTHONPYCACHEPREFIX=$(mktemp -d)
export PYTHONPYCACHEPREFIX
unset PYTHONDONTWRITEBYTECODE
trap 'rm -rf "$JAX_COMPILATION_CACHE_DIR" "$PYTHONPYCACHEPREFIX"' EXIT

# stage TITLE FUNCTION: runs one stage and records its wall time and outcome; every stage runs,
# and the script fails at the end if any stage failed.
declare -a summary=()
failed=0
stage() {
    local start=$SECONDS status=0
    echo "=== $1"
    "$2" || status=$?
    summary+=("$(printf '%-6s %5ds  %s' "$([ "$status" -eq 0 ] && echo ok || echo FAILED)" $((SECONDS - start)) "$1")")
    [ "$status" -eq 0 ] || failed=1
}

# The HTML reports' browser test (tests/cli/test_report_browser.py) needs Debian's chromium and its
# chromedriver: installed here where missing and possible (root, apt); otherwise that test skips and says why.
browser() {
    if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then return 0; fi
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } ||
            echo "chromium could not be installed with apt-get: the browser test will skip" >&2
    else
        echo "chromium is missing and cannot be installed here (not root, or no apt-get): the browser test will skip" >&2
    fi
    return 0
}

# The stages (set -e does not apply inside a function called from `||`, hence the && chains).
# ruff (configured in pyproject.toml) lints and checks the formatting of the whole tree first
lint() { .venvs/py311-pure/bin/ruff check . && .venvs/py311-pure/bin/ruff format --check .; }
pure_without_jax() { venv py311-pure "$(python_for 3.11)" '.[test,report]' && lint && browser && tier py311-pure -m pure; }
# The Hugging Face comparison tests' torch (the hf-test extra): the CPU build where pip's find-links
# (PIP_FIND_LINKS) hold one for Python 3.11, rather than the CUDA build of several GB that PyPI serves.
cpu_torch() {
    local dir
    for dir in ${PIP_FIND_LINKS:-}; do ls "$dir"/torch-*+cpu-cp311-*.whl 2>/dev/null || true; done | sort -V | tail -1
}
runtime_tiers() {
    # shellcheck disable=SC2046  # no wheel, no argument
    venv py311 "$(python_for 3.11)" '.[runtime,test,report,hf-test]' $(cpu_torch) &&
        tier py311 -m "(not pure or runtime_extra) and not release_subset"
}
# MaxText itself too: `cpplan run --engine maxtext` runs its trainer in tests/cli/test_engine_maxtext.py
beside_maxtext() {
    venv py312-maxtext "$(python_for 3.12)" '.[runtime,test]' 'maxtext[tpu]==0.2.5' -c constraints/maxtext-0.2.5.txt &&
        tier py312-maxtext -m "(cpu_mesh or runtime_extra) and not release_repeat" "${STAGE3_IGNORE[@]}"
}
# Stage 3 checks that the runtime runs on MaxText's stack; it leaves out seven files stage 2 runs
# whose outcome does not depend on the jax release: the conformance traces of the runtime against
# the specs (the same code on either release), the example scripts (the CLI and runtime they call
# are tested here directly), the CLI's fault handling (signals, refused outputs: our code), the
# calibration and validation harness and its stop on a signal (they time the same runtime steps the
# runtime tests run here),
# and the parallel-block and plain-MLP layers (the same jax calls as the default layer, whose
# training steps the runtime tests run here against the one-device step).
STAGE3_IGNORE=(--ignore=tests/runtime/test_conformance.py --ignore=tests/cli/test_examples_end_to_end.py
               --ignore=tests/cli/test_faults.py --ignore=tests/validation/test_reports_and_calibration.py
               --ignore=tests/validation/test_steptime_stop.py
               --ignore=tests/runtime/test_parallel_block_layer.py --ignore=tests/runtime/test_mlp_activations.py)

stage "1/3 Python 3.11, .[test] only: pure tier" pure_without_jax
stage "2/3 Python 3.11, .[runtime,test]: cpu_mesh, tpu_compile, runtime_extra" runtime_tiers
stage "3/3 Python 3.12, MaxText 0.2.5 stack: cpu_mesh, runtime_extra" beside_maxtext
echo "=== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
