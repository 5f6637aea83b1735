"""The public corpus (`benchmarks/public_runs.csv`): published TPU training runs, each read from its
MaxText flags into a Plan, with a step time derived from the figure its source quotes.

Settings cpplan cannot represent are priced at the nearest it has, and the run's notes say so. The
corpus is a test set: nothing is fitted to it. Columns: docs/provenance/strategies_and_validation.md#corpus
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from cost_models.compute import splash_vmem_problem
from cost_models.errors import CpplanError
from cost_models.models import SWIGLU, DecoderBlock, ModelSpec
from cost_models.targets import Target
from cost_models.units import mfu
from cost_models.vocabulary import DTYPE_BYTES, RematPolicy
from planner.estimate import estimate
from planner.maxtext import (
    ACTIVATIONS_FLAG,
    BLOCK_FLAG,
    parse_activations,
    parse_decoder_block,
    parse_flags,
    read_maxtext,
    unscanned_layers,
)
from planner.plan import Plan
from validation.measured import read_csv_rows
from validation.report import CorpusReport, StepResult
from validation.stats import spearman

CORPUS_COLUMNS = (
    "id",
    "maxtext_flags",
    "maxtext_defaults",
    "metric",
    "value",
    "peak_tflops",
    "flop_rule",
    "figure",
    "repository",
    "path",
    "commit",
    "date",
    "derivation",
    "notes",
)
CITATION_COLUMNS = ("figure", "repository", "path", "commit", "date", "derivation")
METRICS = ("seconds", "tokens_per_s_per_device", "mfu")

# MaxText's attention FLOPs per layer, token pair, head and head dim, by version (12: full square, 6: causal)
# evidence: docs/provenance/strategies_and_validation.md#corpus
FLOP_RULES = {
    "maxtext-2023-10": 12,  # maxtext@e47fa1b5d377ee1043e663f1414024f4d0f12df0 MaxText/train.py
    "maxtext-2023-12": 6,  # maxtext@76bd53b0f44caf989c88189afadeb1062f9254f0 MaxText/train.py
}

# MaxText's flash attention ran non-causal before this date, so earlier runs are priced with a full mask
CAUSAL_FLASH_SINCE = "2023-11-07"

# The flags the synthetic shape is built from here (`synthetic_shape`), not by the MaxText import.
SHAPE_FLAGS = (
    "global_parameter_scale",
    "base_emb_dim",
    "base_num_heads",
    "base_num_query_heads",
    "base_num_kv_heads",
    "base_mlp_dim",
    "base_num_decoder_layers",
    "head_dim",
    "vocab_size",
    "mlp_activations",
    "logits_via_embedding",
    BLOCK_FLAG,
)
# before this date MaxText's default decoder block was the parallel one (decoder_block="default"), not llama2
LLAMA2_BLOCK_DEFAULT_SINCE = "2024-02-14"
# before this date MaxText ran the layers of its gemma4_small block (Gemma 4 E2B, E4B) with no rematerialization
# whatever remat_policy said (maxtext e6371a47f, "Support activation rematerialization with small Gemma models"):
# earlier runs are priced at the policy that keeps the most (docs/provenance/ironwood_recipes.md)
SMALL_GEMMA_REMAT_SINCE = "2026-08-17"


@dataclass(frozen=True)
class CorpusRun:
    """One published run: its plan, the step time derived from its figure, and how it was read."""

    run_id: str
    plan: Plan
    step_seconds: float
    notes: tuple[str, ...]
    citation: str
    row: dict


def _number(row: dict, column: str, where: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise CpplanError(f"{where}: {column}={text!r} is not a number; give the figure as a plain number.") from None
    if not math.isfinite(value) or value <= 0:
        raise CpplanError(f"{where}: {column}={text!r} must be a positive, finite number.")
    return value


def get_individual_scales(scale: int) -> tuple[int, int, int, int]:
    """(embed, heads, mlp, layers) doublings of `global_parameter_scale`, as MaxText's
    pyconfig.get_individual_scales splits it.

    Raises:
        CpplanError: the scale is not a power of two.
    """
    if scale < 1 or scale & (scale - 1):
        raise CpplanError(f"global_parameter_scale={scale} must be a power of two, as MaxText requires.")
    base, rem = divmod(int(math.log2(scale)), 3)
    heads = base + int(rem > 0)
    return base + int(rem > 1), heads, heads, base


@dataclass(frozen=True)
class SyntheticShape:
    """A MaxText model set by `global_parameter_scale` over base.yml's base shape, as MaxText built it."""

    emb: int
    heads: int
    kv_heads: int
    head_dim: int
    mlp: int
    layers: int
    vocab: int
    activations: tuple[str, ...]  # `mlp_activations`: one `wi` per activation
    tied: bool
    block: DecoderBlock = DecoderBlock.LLAMA2  # `decoder_block`, or its default at the run's commit

    @property
    def mlp_matrices(self) -> int:
        """The MLP's matrices: one `wi` per activation, plus `wo`."""
        return len(self.activations) + 1

    @property
    def params(self) -> int:
        """MaxText's parameter count (its pytree's matrices; norm scales, under 0.01%, left out)."""
        per_layer = (
            2 * self.emb * self.head_dim * (self.heads + self.kv_heads) + self.mlp_matrices * self.emb * self.mlp
        )
        return self.vocab * self.emb * (1 if self.tied else 2) + self.layers * per_layer

    def step_flops_per_device(self, *, rule: str, seq_len: int, per_device_batch: float) -> float:
        """MaxText's training FLOPs per device per step under `rule` (see `FLOP_RULES`)."""
        attention = FLOP_RULES[rule] * self.heads * self.layers * self.head_dim * seq_len**2 * per_device_batch
        return 6 * self.params * seq_len * per_device_batch + attention

    def model_spec(self, name: str) -> ModelSpec:
        """The model as MaxText built it.

        Raises:
            CpplanError: an MLP activation cpplan does not run.
        """
        return ModelSpec(
            name,
            self.layers,
            self.emb,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.mlp,
            self.vocab,
            tie_embeddings=self.tied,
            mlp_activations=self.activations,
            decoder_block=self.block,
        )


def synthetic_shape(flags: dict, *, date: str | None = None) -> SyntheticShape:
    """The model MaxText builds from `global_parameter_scale` and the base_* flags; `date` (YYYY-MM-DD,
    None: today) of the run's commit picks the default decoder block.

    Raises:
        CpplanError: a base_* flag is missing or not a whole number, or a decoder block cpplan does not run.
    """

    def whole(key):
        try:
            return int(flags[key])
        except KeyError:
            raise CpplanError(
                f"a synthetic MaxText model needs {key} (base.yml's value at the run's commit, in maxtext_defaults)."
            ) from None
        except ValueError:
            raise CpplanError(f"MaxText flag {key}={flags[key]!r} is not a whole number.") from None

    emb_s, heads_s, mlp_s, layer_s = get_individual_scales(whole("global_parameter_scale"))
    heads = whole("base_num_heads") if "base_num_heads" in flags else whole("base_num_query_heads")
    kv = whole("base_num_kv_heads") if "base_num_kv_heads" in flags else heads  # 2023: multi-head only
    activations = parse_activations(flags[ACTIVATIONS_FLAG]) if ACTIVATIONS_FLAG in flags else SWIGLU
    if BLOCK_FLAG in flags:
        block = parse_decoder_block(flags[BLOCK_FLAG])
    else:
        block = DecoderBlock.DEFAULT if date and date < LLAMA2_BLOCK_DEFAULT_SINCE else DecoderBlock.LLAMA2
    return SyntheticShape(
        emb=whole("base_emb_dim") << emb_s,
        heads=heads << heads_s,
        kv_heads=kv << heads_s,
        head_dim=whole("head_dim"),
        mlp=whole("base_mlp_dim") << mlp_s,
        layers=whole("base_num_decoder_layers") << layer_s,
        vocab=whole("vocab_size"),
        activations=activations,
        tied=str(flags.get("logits_via_embedding", "false")).lower() == "true",
        block=block,
    )


def _words(text: str, where: str) -> dict[str, str]:
    try:
        return parse_flags(text or "")
    except CpplanError as err:
        raise CpplanError(f"{where}: {err}") from None


def run_flags(row: dict, where: str) -> dict[str, str]:
    """The run's effective MaxText flags: base.yml's values it relied on, then its own flags."""
    return {**_words(row.get("maxtext_defaults", ""), where), **_words(row.get("maxtext_flags", ""), where)}


def plan_of(row: dict, where: str) -> tuple[Plan, list[str], SyntheticShape | None]:
    """The row's plan, the approximations made to price it, and its synthetic shape (if any).

    Raises:
        CpplanError: the flags are not a plan cpplan can build (naming the row).
    """
    flags = run_flags(row, where)
    notes: list[str] = []
    attention = flags.pop("attention", "flash")
    flash = flags.pop("enable_flash_attention", "true").lower() == "true" and attention in ("flash", "autoselected")
    if not flash:
        notes.append(f"attention={attention} priced as splash (cpplan prices splash attention only)")
    shape = None
    model = None
    if "global_parameter_scale" in flags:
        shape = synthetic_shape(flags, date=(row.get("date") or "").strip() or None)
        model = shape.model_spec(f"maxtext-synthetic-{flags['global_parameter_scale']}x")
    try:
        read = read_maxtext(flags, model=model)
    except CpplanError as err:
        raise CpplanError(f"{where}: {err}") from None
    notes += read.notes
    unpriced = [name for name in read.unread if shape is None or name not in SHAPE_FLAGS]
    if unpriced:
        notes.append(f"flags cpplan does not price: {', '.join(unpriced)}")
    plan, block_notes = _blocks_within_vmem(read.plan)
    date = (row.get("date") or "").strip()
    if flash and date and date < CAUSAL_FLASH_SINCE:
        plan = dataclasses.replace(plan, model=dataclasses.replace(plan.model, causal=False))
    if date and date < SMALL_GEMMA_REMAT_SINCE and unscanned_layers(plan.model):
        kept = RematPolicy.MINIMAL_WITH_CONTEXT
        notes.append(
            f"remat_policy={plan.remat.value} not applied: MaxText before {SMALL_GEMMA_REMAT_SINCE} ran model "
            f"{plan.model.name}'s layers (its gemma4_small block) with no rematerialization; priced as "
            f"{kept.value}, the policy that keeps the most (every matmul output and the attention output)"
        )
        plan = dataclasses.replace(plan, remat=kept, remat_custom=())
    return plan, notes + block_notes, shape


def _blocks_within_vmem(plan: Plan) -> tuple[Plan, list[str]]:
    """The plan with its splash blocks halved until they fit the chip's scoped VMEM (so that they compile)."""
    act_bytes = DTYPE_BYTES[plan.compute_dtype]
    chip = plan.topology_spec.chip
    block_q, block_kv = plan.block_q, plan.block_kv
    problem = splash_vmem_problem(block_q, block_kv, head_dim=plan.model.head_dim, act_bytes=act_bytes, chip=chip)
    if problem is None:
        return plan, []
    while (
        splash_vmem_problem(block_q, block_kv, head_dim=plan.model.head_dim, act_bytes=act_bytes, chip=chip)
        and max(block_q, block_kv) > 128
    ):
        block_q, block_kv = max(128, block_q // 2), max(128, block_kv // 2)
    return (
        dataclasses.replace(plan, block_q=block_q, block_kv=block_kv),
        [f"{problem}: priced at blocks {block_q}×{block_kv}"],
    )


def step_seconds(row: dict, plan: Plan, shape: SyntheticShape | None, where: str) -> float:
    """The row's step time, derived from its figure as its `metric` says.

    Raises:
        CpplanError: an unknown metric or flop rule, or an `mfu` row without a synthetic shape.
    """
    metric = (row.get("metric") or "").strip()
    value = _number(row, "value", where)
    per_device = plan.global_batch / plan.topology_spec.num_devices
    if metric == "seconds":
        return value
    if metric == "tokens_per_s_per_device":
        return per_device * plan.seq_len / value
    if metric == "mfu":
        rule = (row.get("flop_rule") or "").strip()
        if rule not in FLOP_RULES:
            raise CpplanError(
                f"{where}: flop_rule={rule!r}; an mfu row needs the FLOP count of its MaxText version, "
                f"one of {', '.join(FLOP_RULES)}."
            )
        if shape is None:
            raise CpplanError(
                f"{where}: an mfu row needs a synthetic model (global_parameter_scale) whose FLOPs the "
                "reader counts as that MaxText version did; give a logged step time instead."
            )
        achieved = value / 100 * _number(row, "peak_tflops", where) * 1e12
        return shape.step_flops_per_device(rule=rule, seq_len=plan.seq_len, per_device_batch=per_device) / achieved
    raise CpplanError(f"{where}: metric={metric!r} is not one of {', '.join(METRICS)}.")


def is_corpus(path: "str | Path") -> bool:
    """Whether a measured-steps file is a corpus (its header has the corpus's columns)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return "maxtext_flags" in header


def read_corpus(path: "str | Path", *, refused: "list[tuple[str, str]] | None" = None) -> list[CorpusRun]:
    """Every run of a corpus CSV; with a `refused` list, the rows that are not a plan cpplan prices are put
    there as (id, why) instead of raised.

    Raises:
        CpplanError: unreadable file, wrong columns, a duplicate id, a row without its citation
            and derivation, or a row that is not a plan (each naming its line).
    """
    path = Path(path)
    rows = read_csv_rows(path)
    if not rows or set(rows[0]) != set(CORPUS_COLUMNS):
        raise CpplanError(f"{str(path)!r}: a corpus needs the header {', '.join(CORPUS_COLUMNS)} and one row per run.")
    runs, seen = [], set()
    for line, row in enumerate(rows, start=2):
        where = f"{path.name} line {line} ({row.get('id') or 'no id'})"
        if None in row or None in row.values():
            raise CpplanError(f"{where}: the row's cells do not match the header's {len(CORPUS_COLUMNS)} columns.")
        missing = [c for c in ("id",) + CITATION_COLUMNS if not row[c].strip()]
        if missing:
            raise CpplanError(f"{where}: {', '.join(missing)} empty; every run needs its id, citation and derivation.")
        if row["id"] in seen:
            raise CpplanError(f"{where}: id {row['id']!r} is used twice; give each run its own.")
        seen.add(row["id"])
        try:
            plan, notes, shape = plan_of(row, where)
        except CpplanError as err:
            if refused is None:
                raise
            refused.append((row["id"], str(err).removeprefix(f"{where}: ")))
            continue
        citation = f"{row['repository']}@{row['commit'][:12]}:{row['path']} ({row['date']})"
        runs.append(CorpusRun(row["id"], plan, step_seconds(row, plan, shape, where), tuple(notes), citation, row))
    return runs


@dataclass(frozen=True)
class Choice:
    """One case measured under several plans (one source's table): cpplan's first choice against the fastest."""

    case: str
    chosen: str  # run id of the plan with the least predicted step time
    fastest: str  # run id of the plan with the least published step time
    regret: float  # the chosen plan's published step time over the fastest's, less 1
    spearman: float | None  # rank correlation of predicted and published step times over the case's plans
    runs: int


def choices(report: CorpusReport) -> list[Choice]:
    """One `Choice` per case of `report` with at least two plans, in order of first run: the test a
    planner answers to is the plan it picks, not its step times."""
    groups: dict[tuple, list] = {}
    for r in report.measured:
        p = r.plan
        groups.setdefault((p.model.name, p.topology, p.seq_len, p.global_batch, r.source), []).append(r)
    out = []
    for (model, topology, seq_len, batch, source), rs in groups.items():
        if len(rs) < 2:
            continue
        chosen = min(rs, key=lambda r: r.predicted.step_time_s)
        fastest = min(rs, key=lambda r: r.measured_step_s)
        rho = spearman([r.predicted.step_time_s for r in rs], [r.measured_step_s for r in rs])
        where = source.split(":", 1)[0]  # the citation's repository@commit
        out.append(
            Choice(
                f"{model} {topology} {seq_len} tokens, batch {batch}, {where}",
                chosen.run_id,
                fastest.run_id,
                chosen.measured_step_s / fastest.measured_step_s - 1,
                rho if math.isfinite(rho) else None,
                len(rs),
            )
        )
    return out


def compare_corpus(runs: "list[CorpusRun]", *, title: str = "cpplan vs published TPU runs") -> CorpusReport:
    """Prices every run's plan as MaxText runs it, against the published step time. Both MFU figures use
    cpplan's FLOP count, so they compare across MaxText versions.

    Raises:
        CpplanError: a run's plan cannot be priced (naming the run).
    """
    report = CorpusReport(title)
    for run in runs:
        try:
            e = estimate(run.plan, target=Target.MAXTEXT)  # the runs are MaxText's
        except CpplanError as err:
            raise CpplanError(f"corpus run {run.run_id}: {err}") from None
        report.results.append(
            StepResult(
                run.plan,
                e,
                run.step_seconds,
                mfu(e.model_flops, run.step_seconds, e.num_devices, e.peak_flops_per_device),
                source=run.citation,
                run_id=run.run_id,
                notes=run.notes,
            )
        )
    return report


# the chip whose published multi-slice runs the DCN latency is fitted to (regenerate/fit_dcn_latency.py):
# their growth from one slice is no test of it
DCN_FITTED_CHIP = "v5e"


def slice_growth(runs: list[CorpusRun], predicted_s: dict[str, float]) -> list[dict]:
    """Each multi-slice run beside the same run on one slice (the same flags but the slice count):
    its step's growth from one slice, published and priced, and their difference per decoder layer; with
    the run's published step and its one-slice twin's price."""

    def setting(run: CorpusRun) -> tuple:
        flags = parse_flags(run.row["maxtext_flags"])
        slices = int(flags.pop("compile_topology_num_slices", "1"))
        return tuple(sorted(flags.items())), slices

    one_slice = {setting(r)[0]: r for r in runs if setting(r)[1] == 1}
    rows = []
    for run in runs:
        key, slices = setting(run)
        base = one_slice.get(key)
        if slices == 1 or base is None:
            continue
        published = run.step_seconds - base.step_seconds
        priced = predicted_s[run.run_id] - predicted_s[base.run_id]
        layers = run.plan.model.num_layers
        rows.append(
            {
                "run": run.run_id,
                "slices": slices,
                "layers": layers,
                "published_growth_s": published,
                "priced_growth_s": priced,
                "unpriced_ms_per_layer": 1e3 * (published - priced) / layers,
                "published_s": run.step_seconds,
                "twin_priced_s": predicted_s[base.run_id],
            }
        )
    return rows
