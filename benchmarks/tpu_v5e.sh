#!/usr/bin/env bash
# cpplan on one TPU v5e chip, stage by stage, every output under OUT:
#
#   benchmarks/tpu_v5e.sh STAGE OUT
#
#   calibrate       `cpplan calibrate --topology v5e:1x1`: the measured row and its raw timings
#   validate-h128   `cpplan validate` of the heads-of-128 model (benchmarks/tpu_v5e/llama-4l-h128.json) at
#                   SEQ_LENS: the best plans of PLANS (default 3) remat policies, each also with VALIDATE_FLAGS' variants
#                   (default: the other attention backward, fused or separate, where it fits; VALIDATE_FLAGS= for none)
#   validate-h256   the same for the heads-of-256 model (benchmarks/tpu_v5e/llama-4l-h256.json)
#   validate-moe    the same for a mixture of experts (benchmarks/tpu_v5e/mixtral-4l-e8.json: 8 experts, top 2)
#   validate-model  the same for the config.json MODEL names (its output under validate-<its file's stem>)
#   grouped         benchmarks/tpu_grouped_matmul.py: grouped matmuls (ragged_dot, megablox's gmm) against
#                   the v5e row's grouped-matmul model
#   run             `cpplan run` of 50 steps with checkpoints, and the same stopped at step 30 and
#                   resumed: prints whether the losses are equal
#   loss            `cpplan run` of RUN_STEPS steps of LOSS_MODEL (default the 0.5B-parameter
#                   benchmarks/tpu_v5e/llama-16l-0.5b.json) on synthetic tokens with the default optimizer:
#                   the highest loss against the first
#   hf-text         a Llama checkpoint of random weights (benchmarks/random_hf_checkpoint.py) loaded with
#                   --init-from and trained RUN_STEPS steps on text (the checkout's docs/ and README.md as
#                   bytes) with the default optimizer: whether its loss falls
#   vmem-steps      benchmarks/tpu_scoped_vmem_steps.py on LOSS_MODEL at VMEM_SEQ (default 8k): its best plans whose
#                   splash blocks need no raised scoped VMEM, each compiled at the compiler's default and at the
#                   chip's most, their steps run alternately, a profile of each; the calibration kernels at both
#   compile-phases  benchmarks/tpu_compile_phases.py on LOSS_MODEL at 8k,16k: where a compile's time goes
#   long-kernels    benchmarks/tpu_long_kernels.py: splash at a 1M-4M ring's and all-gather's shapes (128K-512K
#                   keys), priced with the v5e row as it stands (held out: the row was fitted to 4K-128K)
#   causal-steps    benchmarks/tpu_causal_steps.py: splash causal and over every key at calibrate's 32K shapes: what
#                   a causal call's skipped grid steps cost
#   all             calibrate, validate-h128, validate-h256 and run
#
# Each stage is bounded (STAGE_SECONDS, default 420: a command on the lent chip may take 10 minutes)
# and independent: one that fails is reported and the next one runs. A validate stage stopped by its
# bound ends after the plan in hand and still writes its report; measurements.jsonl grows plan by plan.
# E.g. SEQ_LENS=64k,128k VALIDATE_FLAGS="--blocks 1024,2048" benchmarks/tpu_v5e.sh validate-h128 out/long
# Runs from a checkout without installing cpplan: the runtime's wheels, when .whl-tpu/ holds them
# (scripts/tpu_wheels.sh), are installed under $TMPDIR/cpplan-site (SITE) first.
set -uo pipefail

STAGE="${1:-}"
OUT="${2:-}"
if [ -z "$STAGE" ] || [ -z "$OUT" ]; then
  awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"

TOPOLOGY="${TOPOLOGY:-v5e:1x1}"
H128="${H128:-benchmarks/tpu_v5e/llama-4l-h128.json}"
H256="${H256:-benchmarks/tpu_v5e/llama-4l-h256.json}"
MOE="${MOE:-benchmarks/tpu_v5e/mixtral-4l-e8.json}"
LOSS_MODEL="${LOSS_MODEL:-benchmarks/tpu_v5e/llama-16l-0.5b.json}"
LOSS_BATCH="${LOSS_BATCH:-2}"  # sequences a step of the loss and hf-text stages
SEQ_LENS="${SEQ_LENS:-4k,8k,16k,32k,64k,128k}"
VALIDATE_FLAGS="${VALIDATE_FLAGS---both-backwards}"  # set and empty: no variants
STAGE_SECONDS="${STAGE_SECONDS:-420}"
PLANS="${PLANS:-3}"
DTYPE="${DTYPE:-bfloat16}"
RUN_SEQ="${RUN_SEQ:-16k}"
RUN_STEPS="${RUN_STEPS:-50}"
RUN_STOP="${RUN_STOP:-30}"
VMEM_SEQ="${VMEM_SEQ:-8k}"
SITE="${SITE:-${TMPDIR:-/tmp}/cpplan-site}"

# the wheels under SITE, once; cpplan from this checkout (no pip install -e .)
if [ -d .whl-tpu ] && ! PYTHONPATH="$SITE:${PYTHONPATH:-}" python3 -c "import flax, optax, orbax.checkpoint" 2>/dev/null; then
  PIP_CONFIG_FILE=/dev/null python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl-tpu/*.whl || echo "tpu_v5e: installing .whl-tpu/ failed" >&2
fi
# appended, never in front: the machine's own jax stack must stay the one found first
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$ROOT:$SITE"
export PYTHONUNBUFFERED=1
export TPU_SKIP_MDS_QUERY="${TPU_SKIP_MDS_QUERY:-1}"  # one VM, no metadata server to ask
CPPLAN=(python3 -m cli)

bounded() {  # SIGTERM at the bound (cpplan stops after the step in hand and writes what it has), SIGKILL 45 s later
  timeout -k 45 -s TERM "$STAGE_SECONDS" "$@"
}

calibrate() {
  mkdir -p "$OUT/calibrate"
  bounded "${CPPLAN[@]}" calibrate --topology "$TOPOLOGY" --dtype "$DTYPE" --model "$H128" \
    --out "$OUT/calibrate" 2>&1 | tee "$OUT/calibrate/calibrate.log"
}

validate_one() {  # NAME MODEL
  local dir="$OUT/validate-$1"
  mkdir -p "$dir"
  # the best plan of each of PLANS remat policies at each length (blocks as the search chose), with variants
  # shellcheck disable=SC2086  # VALIDATE_FLAGS is a list of words
  bounded "${CPPLAN[@]}" validate --model "$2" --seq-lens "$SEQ_LENS" --topology "$TOPOLOGY" --compute-dtype "$DTYPE" \
    --max-plans "$PLANS" --top "$PLANS" --steps 3 $VALIDATE_FLAGS --no-plots --out "$dir" 2>&1 | tee "$dir/validate.log"
}

run_resume() {
  local dir="$OUT/run" work
  mkdir -p "$dir"
  work="$(mktemp -d -t cpplan-run.XXXXXX)"
  local common=(run --model "$H128" --seq-len "$RUN_SEQ" --topology "$TOPOLOGY" --exact-batch 1 --seed 0
    --checkpoint-every 10 --keep-checkpoints 1 --json)
  echo "uninterrupted: $RUN_STEPS steps"
  bounded "${CPPLAN[@]}" "${common[@]}" --steps "$RUN_STEPS" --run-dir "$work/full" >"$dir/full.json" \
    2> >(tee "$dir/full.log" >&2)
  rm -rf "$work/full"  # a checkpoint of the model's weights and moments takes GiBs
  echo "stopped after a checkpoint: $RUN_STOP steps, then resumed to $RUN_STEPS"
  bounded "${CPPLAN[@]}" "${common[@]}" --steps "$RUN_STOP" --run-dir "$work/resumed" >"$dir/first.json" \
    2> >(tee "$dir/first.log" >&2)
  bounded "${CPPLAN[@]}" "${common[@]}" --steps "$RUN_STEPS" --run-dir "$work/resumed" >"$dir/resumed.json" \
    2> >(tee "$dir/resumed.log" >&2)
  rm -rf "$work"
  python3 benchmarks/compare_resumed.py "$dir/full.json" "$dir/first.json" "$dir/resumed.json" | tee "$dir/compare.txt"
}

train_losses() {  # NAME: `cpplan run` with the default optimizer, then its losses summarised; the rest are run's flags
  local dir="$OUT/$1"
  shift
  mkdir -p "$dir"
  bounded "${CPPLAN[@]}" run --seq-len "$RUN_SEQ" --topology "$TOPOLOGY" --exact-batch "$LOSS_BATCH" --seed 0 \
    --steps "$RUN_STEPS" --checkpoint-every 0 --run-dir "$dir/run" --json "$@" >"$dir/run.json" \
    2> >(tee "$dir/run.log" >&2)
  rm -rf "$dir/run/checkpoints"  # a stopped run saves its weights and moments: GiBs
  python3 benchmarks/loss_summary.py "$dir/run.json" | tee "$dir/summary.txt"
}

hf_text() {
  local work
  work="$(mktemp -d -t cpplan-hf.XXXXXX)"
  python3 benchmarks/random_hf_checkpoint.py "$work/ckpt" && cat docs/*.md docs/*/*.md README.md >"$work/text.txt" &&
    train_losses hf-text --model "$work/ckpt/config.json" --init-from "$work/ckpt" --data "$work/text.txt"
  local status=$?
  rm -rf "$work"
  return $status
}

stage() {  # NAME: runs one stage, says how it ended, never stops the script
  local start=$SECONDS status
  echo "== $1 (at most ${STAGE_SECONDS} s a command) =="
  case "$1" in
    calibrate) calibrate ;;
    validate-h128) validate_one h128 "$H128" ;;
    validate-h256) validate_one h256 "$H256" ;;
    validate-moe) validate_one moe "$MOE" ;;
    validate-model) [ -f "${MODEL:-}" ] || { echo "tpu_v5e: validate-model needs MODEL=<a config.json>" >&2; return 2; }
      validate_one "$(basename "$MODEL" .json)" "$MODEL" ;;
    grouped) mkdir -p "$OUT/grouped" && bounded python3 benchmarks/tpu_grouped_matmul.py --chip v5e \
      --out "$OUT/grouped/grouped_matmul.jsonl" 2>&1 | tee "$OUT/grouped/grouped_matmul.txt" ;;
    run) run_resume ;;
    loss) train_losses loss --model "$LOSS_MODEL" ;;
    hf-text) hf_text ;;
    vmem-steps) bounded python3 benchmarks/tpu_scoped_vmem_steps.py "$LOSS_MODEL" "$VMEM_SEQ" "$OUT/vmem-steps" "$TOPOLOGY" ;;
    compile-phases) bounded python3 benchmarks/tpu_compile_phases.py "$LOSS_MODEL" 8k,16k "$OUT/compile-phases" ;;
    long-kernels) bounded python3 benchmarks/tpu_long_kernels.py "$OUT/long-kernels" ;;
    causal-steps) bounded python3 benchmarks/tpu_causal_steps.py "$OUT/causal-steps" ;;
    *) echo "tpu_v5e: unknown stage $1; see the usage: $0" >&2; return 2 ;;
  esac
  status=$?
  echo "== $1: exit status $status after $((SECONDS - start)) s =="
  return $status
}

case "$STAGE" in
  all) STAGES=(calibrate validate-h128 validate-h256 run) ;;
  *) STAGES=("$STAGE") ;;
esac
failed=0
for s in "${STAGES[@]}"; do
  stage "$s" || failed=$((failed + 1))
done
echo "tpu_v5e: ${#STAGES[@]} stage(s), $failed failed; outputs in $OUT"
[ "$failed" -eq 0 ]
