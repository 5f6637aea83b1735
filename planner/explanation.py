"""`Explanation`: what the planner chose, why, what came close, and why the rest was rejected."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections import Counter, defaultdict

import numpy as np

from cost_models.accuracy import ErrorBand, error_band, memory_band
from cost_models.candidates import group_links
from cost_models.compute import DQ_PARTIALS_HBM_SHARE, SCOPED_VMEM_FLAG, backward_core_share
from cost_models.document_tiles import row_fraction_computed, rows_per_call
from cost_models.estimate import Estimate
from cost_models.pricing import LOSS_MEMORY, STATIC_MEMORY, UPDATE_MEMORY
from cost_models.pricing.attention import key_chunks, vmapped_rows
from cost_models.pricing.communication import data_all_reduces
from cost_models.pricing.memory import ATTENTION_SIDE, FORWARD_MEMORY, HELD_BY_FEW, layer_bytes
from cost_models.remat import remat_label
from cost_models.strategies import STRATEGIES
from cost_models.targets import TRAITS, Target, model_refusal
from cost_models.topology import DCN_DIM
from cost_models.units import GiB, counted
from cost_models.vocabulary import AXES, CPStrategy, LoadBalance
from planner.estimate import candidates_of, estimate, plan_error_band
from planner.maxtext import maxtext_problems
from planner.options import format_tokens
from planner.plan import Plan
from planner.search import Ranked, SearchResult

DEFAULT_TOP = 5


def format_seconds(seconds: float) -> str:
    """A duration in the unit that reads best: '162 s', '1.81 s', '3.2 ms', '40 µs'."""
    if seconds >= 100:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


_s = format_seconds  # the short name the report's many f-strings use


def _memory_line(phase: str, e: Estimate, keys: tuple[str, ...]) -> str:
    """One phase of the HBM section: its total, then each component the plan holds (those few plans hold,
    `HELD_BY_FEW`, only where it holds them)."""
    held = [k for k in keys if e.hbm_bytes[k] > 0 or k not in HELD_BY_FEW]
    return (
        f"  {phase:<10} {_gib(sum(e.hbm_bytes[k] for k in keys))} ("
        + ", ".join(f"{k} {_gib(e.hbm_bytes[k])}" for k in held)
        + ")"
    )


def _timed(terms: dict[str, float]) -> str:
    """The terms that take time, as 'name 1.2 ms, …' ('' where none does)."""
    return ", ".join(f"{k} {_s(v)}" for k, v in terms.items() if v > 0)


def _gib(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB"


def dcn_traffic(plan: Plan, estimate: Estimate) -> list[dict]:
    """The collectives of a multi-slice plan whose groups cross slices, with how much of each is
    on DCN and how much the step waits for.

    The DCN part is the share of the collective's bandwidth time spent across slices
    (`Topology.dcn_share`), and for the data all-reduce the DCN latency its calls wait
    (`data_all_reduces`, a reduce-scatter and an all-gather each); FSDP traffic shares the layers' compute
    window, so the part of it not exposed is hidden; the data all-reduce is exposed.

    Args:
        plan: the plan; estimate: its price.
    Returns:
        One dict per crossing family (collective, slices, seconds, dcn_seconds, exposed_seconds),
        empty on one slice.
    """
    topo = plan.topology_spec
    within = {axis: tuple(s for s in segs if s.dim != DCN_DIM) for axis, segs in plan.segments().items()}
    links = group_links(topo.links, within)
    comm, exposed = estimate.comm_s, estimate.exposed_s
    families = (
        (
            "fsdp all-gathers and reduce-scatters",
            plan.dcn_fsdp,
            links["weights"],
            comm["fsdp_all_gather"] + comm["fsdp_reduce_scatter"],
            exposed["fsdp"],
            0,
        ),
        (
            "data all-reduce",
            plan.dcn_data,
            links["data"],
            comm["data_all_reduce"],
            exposed["data_all_reduce"],
            2 * data_all_reduces(plan.model),
        ),
    )
    return [
        {
            "collective": name,
            "slices": slices,
            "seconds": seconds,
            # the latency the collectives wait across the slices, then the DCN's share of the bytes' time
            "dcn_seconds": waits * topo.chip.dcn_latency_s(slices)
            + (seconds - waits * topo.chip.dcn_latency_s(slices)) * topo.dcn_share(ici, slices),
            "exposed_seconds": exposed_seconds,
        }
        for name, slices, ici, seconds, exposed_seconds, waits in families
        if slices > 1
    ]


def dcn_text(plan: Plan, estimate: Estimate) -> str:
    """One line of the report: which collectives cross DCN and how much of them is hidden."""
    chip = plan.topology_spec.chip
    parts = [
        f"{f['collective']} span {f['slices']} slices: {_s(f['seconds'])}, about {_s(f['dcn_seconds'])} "
        f"of it on DCN; {_s(f['seconds'] - f['exposed_seconds'])} hidden under compute, "
        f"{_s(f['exposed_seconds'])} exposed"
        for f in dcn_traffic(plan, estimate)
    ]
    return (
        f"{plan.num_slices} slices, {chip.dcn_bw_bytes_per_s / 1e9:g} GB/s of DCN per chip and "
        f"{_s(chip.dcn_latency_s(plan.num_slices))} of latency a collective across them; context and "
        f"tensor stay in a slice; " + ("; ".join(parts) or "no collective crosses slices")
    )


def describe_strategy(plan: Plan) -> str:
    """E.g. 'ring over context=128, zigzag' or 'usp: ulysses 2 × ring 64' (the strategy spec's words); with
    a local layers' own strategy, each with the layers it runs."""
    degrees = plan.axis_size("context"), plan.axis_size("context_ulysses"), plan.load_balance is LoadBalance.ZIGZAG
    text = plan.strategy_spec.describe(*degrees)
    if plan.local_strategy is None:
        return text
    return f"{text} (global layers), {STRATEGIES[plan.local_strategy].describe(*degrees)} (local layers)"


def backward_text(plan: Plan, target: Target) -> str:
    """Which splash kernels run the attention's backward on `target`, in words."""
    if not plan.runs_fused_backward(target=target):
        return "splash's dq and dK/dV kernels"
    if target is not Target.CPPLAN and plan.dq_reduction_steps:
        return f"splash's fused kernel (dq as {plan.dq_reduction_steps} rolled partials, summed after it)"
    text = "splash's fused kernel (dq as partials, one per key block, summed after it"
    chunks = fused_key_chunks(plan, target)
    if chunks > 1:
        share = f"{DQ_PARTIALS_HBM_SHARE:.1%} of the HBM"
        text += f"; over {chunks} chunks of the keys, one chunk's partials at a time, within {share}"
    return text + ")"


def fused_key_chunks(plan: Plan, target: Target = Target.CPPLAN) -> int:
    """The most chunks of its keys any of the plan's fused backward calls runs over on `target` (`key_chunks`)."""
    x = candidates_of(plan)
    spec = plan.strategy_spec
    layout = spec.layout(x)
    in_chunks = TRAITS[target].fused_backward_in_key_chunks
    return max(int(np.max(key_chunks(x, layout, call, in_chunks))) for call in spec.kernel_calls(x, layout))


def short(plan: Plan) -> str:
    """One line: strategy, the non-trivial mesh axes (and the slices data and fsdp span), remat."""
    mesh = " ".join(f"{a}={s}" for a, s in plan.mesh if s > 1) or "single device"
    if plan.num_slices > 1:
        mesh += f" (over DCN: dcn_data={plan.dcn_data} dcn_fsdp={plan.dcn_fsdp})"
    return f"{describe_strategy(plan)}; {mesh}; remat {plan.remat_label}"


def _terms(e: Estimate) -> dict[str, float]:
    terms = {f"{k} compute": v for k, v in e.compute_s.items()}
    terms["HBM-bound work"] = e.t_hbm_s
    terms.update({f"exposed {k} traffic": v for k, v in e.exposed_s.items()})
    return terms


def why_slower(alt: Estimate, best: Estimate) -> str:
    """The terms that make `alt` slower than `best`, largest first."""
    a, b = _terms(alt), _terms(best)
    if alt.step_time_s <= best.step_time_s * (1 + 1e-9):
        if alt.headroom_bytes < best.headroom_bytes:
            return f"as fast; ranked after it for less memory headroom ({_gib(alt.headroom_bytes)} free)"
        return "as fast, with the same headroom; ranked after it by mesh order"
    diffs = sorted(((a[k] - b[k], k) for k in a), reverse=True)
    excess = alt.step_time_s - best.step_time_s
    return ", ".join(f"{k} +{_s(d)}" for d, k in diffs[:2] if d > 0.05 * excess)


def is_tie(alt: Estimate, best: Estimate, band: ErrorBand | None) -> bool:
    """Whether `alt`'s step time lies within the model's measured error of the chosen plan's: the
    model cannot tell them apart (no band measured for the chip: no ties)."""
    return within_band(alt.step_time_s, best, band)


def within_band(step_time_s: float, best: Estimate, band: ErrorBand | None) -> bool:
    """`is_tie` of a plan that takes `step_time_s`."""
    return band is not None and step_time_s <= best.step_time_s * (1 + band.relative)


def tie_breakers(alt: Ranked, best: Ranked) -> dict:
    """What tells a tied alternative from the chosen plan, beside a step time the model cannot
    separate: memory headroom, communication left exposed, and whether MaxText can run each."""
    alt_problems, best_problems = maxtext_problems(alt.plan), maxtext_problems(best.plan)
    return {
        "headroom_bytes": alt.estimate.headroom_bytes,
        "chosen_headroom_bytes": best.estimate.headroom_bytes,
        "exposed_s": sum(alt.estimate.exposed_s.values()),
        "chosen_exposed_s": sum(best.estimate.exposed_s.values()),
        "maxtext_runs": not alt_problems,
        "chosen_maxtext_runs": not best_problems,
        "maxtext_problems": alt_problems,
    }


def tie_text(breakers: dict) -> str:
    """The tie-breakers as a clause: where the alternative is better or worse than the chosen plan."""
    parts = []
    free, chosen_free = breakers["headroom_bytes"], breakers["chosen_headroom_bytes"]
    if abs(free - chosen_free) >= 0.05 * GiB:
        parts.append(
            f"{'more' if free > chosen_free else 'less'} memory headroom ({_gib(free)} vs {_gib(chosen_free)} free)"
        )
    exposed, chosen_exposed = breakers["exposed_s"], breakers["chosen_exposed_s"]
    if abs(exposed - chosen_exposed) > 0.01 * max(exposed, chosen_exposed, 1e-12):
        parts.append(
            f"{'less' if exposed < chosen_exposed else 'more'} exposed communication "
            f"({_s(exposed)} vs {_s(chosen_exposed)})"
        )
    if breakers["maxtext_runs"] != breakers["chosen_maxtext_runs"]:
        parts.append(
            "MaxText can run it, not the chosen plan"
            if breakers["maxtext_runs"]
            else f"MaxText cannot run it ({breakers['maxtext_problems'][0]})"
        )
    elif breakers["maxtext_runs"]:
        parts.append("MaxText runs both")
    return ", ".join(parts) or "the same headroom and exposed communication, and MaxText runs neither"


def feasible_row(r: Ranked) -> dict:
    """One feasible plan as the plan space lists it: what tells it apart, its step time and HBM."""
    return {
        "strategy": r.plan.cp_strategy.value,
        "local_strategy": r.plan.local_strategy.value if r.plan.local_strategy is not None else None,
        "summary": short(r.plan),
        "blocks": f"{r.plan.block_q}×{r.plan.block_kv}",
        "step_time_s": r.estimate.step_time_s,
        "hbm_bytes_per_device": r.estimate.hbm_bytes_per_device,
    }


class Explanation:
    """The answer to `planner.explain`: `str()` for people, `to_dict()`/`to_json()` for machines."""

    def __init__(self, result: SearchResult, *, top: int = DEFAULT_TOP, global_only=None):
        self.result = result
        self.top = top
        self._global_only = global_only  # searches the request with every layer global (local layers only)
        self._advice = None  # searched on first use: only a search in which nothing fits needs it

    @property
    def best(self) -> Plan | None:
        return self.result.best.plan if self.result.best else None

    @property
    def estimate(self) -> Estimate | None:
        return self.result.best.estimate if self.result.best else None

    def surely_fitting_text(self) -> str:
        """For a choice that fits only within the memory price's measured error: the fastest plan that fits
        with that error to spare, or that none does."""
        e = self.estimate
        for rank, r in enumerate(self.result.ranked, start=1):
            if not r.estimate.marginal:
                return (
                    f"the fastest plan with the margin to spare: #{rank} {short(r.plan)}, "
                    f"{_s(r.estimate.step_time_s)} ({r.estimate.step_time_s / e.step_time_s - 1:+.1%}), "
                    f"{_gib(r.estimate.hbm_bytes_per_device)}"
                )
        return "no feasible plan fits with the margin to spare"

    @property
    def alternatives(self) -> list[Ranked]:
        return self.result.ranked[1 : 1 + self.top]

    @property
    def error_band(self) -> ErrorBand | None:
        """The model's measured step-time error on this chip, in the regime of the chosen plan
        (context-parallel or not, over slices, with experts, at its length, on its target; `cost_models.accuracy`)."""
        best = self.result.best
        if best is None:
            return error_band(self.result.case.topology.chip.name, context_parallel=False)
        return plan_error_band(best.plan, self.result.target)

    def ties(self) -> list[Ranked]:
        """The feasible plans after the choice whose step time lies within the error band of it."""
        if self.result.best is None:
            return []
        band, best = self.error_band, self.result.best.estimate
        # read off the ranking's step times: only the ties are built
        return self.result.ranked.where(lambda entry: within_band(entry.step_time_s, best, band), start=1)

    def band_text(self) -> str:
        """One line: the band, and how many plans it cannot tell from the choice."""
        band = self.error_band
        if band is None:
            return f"none measured for {self.result.case.topology.chip.name}: no plan is called a tie"
        ties = len(self.ties())
        return (
            f"{band.describe()}; {ties} of the other {len(self.result.ranked) - 1} feasible plans lie within it "
            f"(ties: the model cannot tell them from the choice, which stays as the search ranks it)"
        )

    def best_per_strategy(self) -> dict[CPStrategy, Ranked]:
        return self.result.ranked.best_of_each_strategy()

    def rejection_groups(self) -> dict[str, tuple[int, str]]:
        """Category → (count, one example sentence with its candidate)."""
        counts = Counter(r.category for r in self.result.rejections)
        examples: dict[str, str] = {}
        for r in self.result.rejections:
            if r.category not in examples:
                mesh = " ".join(f"{a}={s}" for a, s in r.mesh.items() if s > 1) or "single device"
                examples[r.category] = f"{r.strategy.value} [{mesh}]: {r.reason}"
        return {c: (n, examples[c]) for c, n in counts.most_common()}

    def rejections_by_strategy(self) -> dict[CPStrategy, Counter]:
        out: dict[CPStrategy, Counter] = defaultdict(Counter)
        for r in self.result.rejections:
            out[r.strategy][r.category] += 1
        return out

    # -- text ------------------------------------------------------------------------
    def header(self) -> str:
        case = self.result.case
        m, topo = case.model, case.topology
        # billions as the model cards count them; a model under 10M parameters in millions, not "0.00B"
        params = f"{m.num_params / 1e9:.2f}B" if m.num_params >= 1e7 else f"{m.num_params / 1e6:.2f}M"
        if m.experts:
            e = m.experts
            params += (
                f" ({m.active_params / 1e9:.2f}B active: {e.count} experts, top {e.per_token}"
                + (f", {e.shared} shared" if e.shared else "")
                + (f", {e.dense_layers} dense layers first" if e.dense_layers else "")
                + ")"
            )
        attention = "latent attention, " if m.latent else ""
        header = (
            f"cpplan explain: {m.name} ({params} params, {m.num_layers} layers, {attention}"
            f"{m.num_heads} heads / {m.num_kv_heads} KV heads × {m.head_dim}) at {format_tokens(case.seq_len)} "
            f"tokens × {counted(case.global_batch, 'sequence')} per step on {topo.name} "
            f"({counted(topo.num_chips, 'chip')}, {counted(topo.num_devices, 'device')})"
        )
        refusal = model_refusal(Target.CPPLAN, m)
        if refusal and self.result.target is Target.MAXTEXT:
            header += f"\n  priced for MaxText: {refusal.split(', which ')[0]}, which cpplan's runtime does not run"
        return header

    @functools.cached_property
    def global_only(self) -> SearchResult | None:
        """The same request searched with every layer global, where the model has local layers."""
        return self._global_only() if self._global_only else None

    @functools.cached_property
    def local_layers(self) -> dict | None:
        """For a model with local layers: its layers by mask, the choice's attention seconds as priced and
        as if every layer attended globally, and the plan the global-only price would choose."""
        model, global_only = self.result.case.model, self.global_only
        if not model.has_local_layers or global_only is None:
            return None
        out = {"layers": {mask.describe(): count for mask, count in model.layer_masks}}
        if self.best is not None:
            as_global = estimate(dataclasses.replace(self.best, model=global_only.case.model, local_strategy=None))
            out["attention_s"] = self.estimate.compute_s["attention"]
            out["attention_s_if_global"] = as_global.compute_s["attention"]
            if self.best.local_strategy is not None:
                one = estimate(dataclasses.replace(self.best, local_strategy=None))
                out["one_strategy"] = {"strategy": self.best.cp_strategy.value, "step_time_s": one.step_time_s}
        other = global_only.best
        out["global_only_choice"] = (
            {"summary": short(other.plan), "step_time_s": other.estimate.step_time_s} if other else None
        )
        return out

    @functools.cached_property
    def documents(self) -> dict | None:
        """For rows packed from documents of varying length: their lengths, whether the choice's kernel
        skips the tiles of other documents, and the expected share of the causal mask's tiles it computes
        in a whole row's call (what that kernel computes; the share the mask saved is the rest)."""
        model = self.result.case.model
        documents = model.varying_documents
        if documents is None:
            return None
        out = {"lengths": documents.to_dict(), "mean_tokens": documents.mean_tokens}
        if self.best is not None:
            p = self.best
            rows = int(rows_per_call(p.global_batch / p.batch_shards))
            out["prunes"] = self.result.target.traits.prunes_documents(STRATEGIES[p.cp_strategy])
            out["computed_fraction"] = row_fraction_computed(
                model.global_mask, p.seq_len, min(p.block_q, p.seq_len), min(p.block_kv, p.seq_len), documents, rows
            )
            out["rows_per_call"] = rows
        return out

    def documents_text(self) -> str | None:
        """One line for rows packed from documents of varying length: what the mask saved, or that the
        choice's kernel computes whole rows; None otherwise."""
        docs = self.documents
        if docs is None:
            return None
        text = f"attention: rows packed from {self.result.case.model.describe_documents()}, marked by segment ids"
        if "prunes" not in docs:
            return text
        share = f"{docs['computed_fraction']:.1%} of the causal mask's tiles"  # a whole row's call
        rows = docs["rows_per_call"]
        over = f" (a device's {rows} rows share one schedule)" if rows > 1 else ""
        if docs["prunes"]:
            kernel = "cpplan's runtime" if self.result.target is Target.CPPLAN else "tokamax's splash"
            return (
                f"{text}; {self.best.cp_strategy.value}'s kernel ({kernel}) skips the tiles whose documents "
                f"do not meet: priced at the expected {share}{over}, saving {1 - docs['computed_fraction']:.1%}"
            )
        return (
            f"{text}; under {self.best.cp_strategy.value} its kernel skips blocks by the static mask only, so "
            f"attention is priced as whole rows; a kernel that prunes by segment ids would compute {share} of a "
            f"whole row's call"
        )

    def mask_text(self) -> str | None:
        """One line for a model with a full (non-causal) mask or with local layers, which change what the
        plans do; None for a causal model of global layers."""
        local = self.local_layers
        if local:
            layers = ", ".join(f"{count} {mask}" for mask, count in local["layers"].items())
            documents = self.result.case.model.fixed_documents
            packed = f"rows packed from documents of {format_tokens(documents)} tokens; " if documents else ""
            text = f"attention: {packed}layers {layers}"
            if "attention_s" in local:
                text += (
                    f"; priced by the blocks each mask leaves, the choice's attention takes "
                    f"{format_seconds(local['attention_s'])} a step, {format_seconds(local['attention_s_if_global'])} "
                    f"if every layer attended globally"
                )
            one = local.get("one_strategy")
            if one:
                text += (
                    f"; the local layers run {self.best.local_strategy.value} beside {one['strategy']} on one mesh, "
                    f"where {one['strategy']} for every layer would take {format_seconds(one['step_time_s'])} a step "
                    f"({one['step_time_s'] / self.estimate.step_time_s - 1:+.1%})"
                )
            other = local["global_only_choice"]
            if other is None:
                return text + "; priced as all global, nothing would fit"
            same = self.best is not None and other["summary"] == short(self.best)
            return text + (
                "; priced as all global, the search chooses the same plan"
                if same
                else f"; priced as all global, it would choose {other['summary']} "
                f"at {format_seconds(other['step_time_s'])}"
            )
        if self.result.case.model.causal:
            return None
        return (
            "attention: full (non-causal) mask: every query sees every key, so the kernels compute every block "
            "(up to twice a causal model's work), and zigzag balancing, with nothing to even out, is not searched"
        )

    def _communication_lines(self) -> list[str]:
        """The chosen plan's communication and what of it is exposed, each a line that says something
        where there is none (one device sends nothing)."""
        e = self.estimate
        comm, exposed = _timed(e.comm_s), _timed(e.exposed_s)
        if not comm:
            why = "one device" if self.result.topology.num_devices == 1 else "no axis sends anything"
            return [f"  communication  none: {why}", "  exposed        none: nothing to hide"]
        return [
            f"  communication  {comm} in all",
            f"  exposed        {exposed} (the rest overlaps compute)"
            if exposed
            else "  exposed        none: all of it overlaps compute",
        ]

    def __str__(self) -> str:
        note = [f"Note: {n}." for n in (self.result.mask_note, self.result.batch_note) if n]
        mask, documents = self.mask_text(), self.documents_text()
        lines = [self.header(), *([mask] if mask else []), *([documents] if documents else []), *note, ""]
        if self.best is None:
            lines.append(self.nothing_fits_text())
            return "\n".join(lines)
        p, e = self.best, self.estimate
        placement = ", ".join(f"{a} on {d}" for a, d in p.axis_dims().items()) or "one device"
        lines += [
            "Chosen plan",
            f"  strategy       {describe_strategy(p)}",
            # a dense model's expert axis is always one device: not shown
            "  mesh           " + " ".join(f"{a}={s}" for a, s in p.mesh if a != "expert" or p.model.experts),
            f"  placement      {placement}",
            f"  remat          {p.remat_label}",
            f"  splash blocks  {p.block_q}×{p.block_kv}"
            + (
                f" (scoped VMEM raised: {SCOPED_VMEM_FLAG}={p.scoped_vmem_limit_kib}, which `cpplan run` and "
                f"`cpplan compile` set)"
                if p.scoped_vmem_limit_kib
                else ""
            )
            + (
                f"; dq held as {p.dq_reduction_steps} rolled partials (MaxText's dq_reduction_steps)"
                if p.dq_reduction_steps
                else ""
            )
            + "; loss "
            + (f"in chunks of {p.loss_chunk_tokens} tokens" if p.loss_chunk_tokens else "over full logits"),
            f"  backward       {backward_text(p, self.result.target)}",
            "",
            f"Predicted step   {_s(e.step_time_s)}  (bounds: {_s(e.lower_bound_s)} with perfect overlap, "
            f"{_s(e.upper_bound_s)} with none)",
            f"  error band     {self.band_text()}",
            "  compute        " + ", ".join(f"{k} {_s(v)}" for k, v in e.compute_s.items()),
            "  HBM-bound      " + (_timed(e.hbm_s) or "none"),
            *self._communication_lines(),
            *([f"  across DCN     {dcn_text(p, e)}"] if p.num_slices > 1 else []),
            f"  bottleneck     {e.bottleneck}",
            f"  throughput     {e.tokens_per_s_per_chip:,.0f} tokens/s/chip, MFU {e.mfu:.1%} "
            f"(model FLOPs as MaxText counts them; {e.executed_flops_per_device / 1e12:,.0f} TFLOP executed "
            f"per device)",
            "",
            f"HBM per device   {_gib(e.hbm_bytes_per_device)} of {_gib(e.hbm_capacity_bytes)} "
            f"({e.hbm_bytes_per_device / e.hbm_capacity_bytes:.0%}): held all step + a layer's backward, or the "
            f"loss, the optimizer's update at the step's end or a layer's forward where that holds more",
            _memory_line("all step", e, STATIC_MEMORY),
            f"  {'layer':<10} {_gib(layer_bytes(e.hbm_bytes))}: the larger of its attention side, "
            + _memory_line("", e, ATTENTION_SIDE).strip()
            + f", and its MLP side, mlp_working_set {_gib(e.hbm_bytes['mlp_working_set'])}",
            _memory_line("loss", e, LOSS_MEMORY) + ", on all step's state but the layers' gradients",
            _memory_line("update", e, tuple(k for k in UPDATE_MEMORY if k not in STATIC_MEMORY)),
            _memory_line("forward", e, tuple(k for k in FORWARD_MEMORY if k not in STATIC_MEMORY))
            + ": a layer's kept values formed beside the stacks, its residual stream, the MLP's input and "
            "matrices, on all step's state but the gradients",
        ]
        allocation = memory_band(self.result.case.topology.chip.name, self.result.target.value)
        if allocation is not None and allocation.allocated > allocation.under:
            lines.append(
                f"  a compile given the whole HBM has allocated up to {allocation.allocated:.1%} more than priced, "
                f"the heap's gaps included, which the compiler packs away when short of room ({allocation.rows} "
                f"{allocation.chip} compiles)"
            )
        if e.smem_capacity_bytes:
            lines.append(
                f"  splash SMEM metadata {e.smem_bytes / 2**10:.0f} KiB of {e.smem_capacity_bytes / 2**10:.0f} KiB"
            )
        if e.marginal:
            lines.append(f"  marginal: {e.marginal_reason}")
            if e.fits:
                lines.append(f"  {self.surely_fitting_text()}")
        lines += [f"  not priced: {note}" for note in e.notes]
        lines += ["", f"Alternatives (next {len(self.alternatives)} of {len(self.result.ranked)} feasible)"]
        band = self.error_band
        for i, alt in enumerate(self.alternatives, start=2):
            slower = alt.estimate.step_time_s / e.step_time_s - 1
            detail = (
                f"tie within ±{band.relative:.1%}: {tie_text(tie_breakers(alt, self.result.best))}"
                if is_tie(alt.estimate, e, band)
                else why_slower(alt.estimate, e)
            )
            lines.append(f"  #{i} {short(alt.plan)}: {_s(alt.estimate.step_time_s)} (+{slower:.1%}); {detail}")
        lines += ["", "Best of each strategy"]
        per = self.best_per_strategy()
        by_strategy = self.rejections_by_strategy()
        for strategy in CPStrategy:
            if strategy not in self.result.options.strategies:
                lines.append(f"  {strategy.value:<11} not allowed by the options")
            elif strategy in per:
                r = per[strategy]
                slower = r.estimate.step_time_s / e.step_time_s - 1
                tag = "chosen" if r.plan == p else f"+{slower:.1%}, {why_slower(r.estimate, e)}"
                lines.append(f"  {strategy.value:<11} {_s(r.estimate.step_time_s)} ({tag}) [{short(r.plan)}]")
            else:
                reasons = ", ".join(f"{c} ×{n}" for c, n in by_strategy.get(strategy, Counter()).most_common())
                lines.append(f"  {strategy.value:<11} no feasible candidate (rejected: {reasons or 'none generated'})")
        groups = self.rejection_groups()
        lines += [
            "",
            f"Rejected {counted(len(self.result.rejections), 'candidate')} "
            f"({self.result.candidates_priced} priced placements kept {len(self.result.ranked)} feasible)",
        ]
        for category, (n, example) in groups.items():
            lines.append(f"  {category:<15} {n:>6}  e.g. {example}")
        lines += ["", "Why this plan", "  " + self.why_text()]
        return "\n".join(lines)

    def why_text(self) -> str:
        p, e = self.best, self.estimate
        math = e.t_math_s
        attn_share = e.compute_s["attention"] / math if math else 0.0
        parts = [
            f"At {format_tokens(p.seq_len)} tokens attention is {attn_share:.0%} of the math, "
            f"and the step is bound by {e.bottleneck}."
        ]
        ctx_total, ctx_exposed = e.comm_s["context"], e.exposed_s["context"]
        if p.strategy_spec.hides_traffic_behind_attention and ctx_total > 0:
            parts.append(f"The ring's K/V traffic ({_s(ctx_total)}) hides behind attention except {_s(ctx_exposed)}.")
        elif ctx_total > 0:
            parts.append(f"Its context traffic ({_s(ctx_total)}) is not overlapped.")
        if p.load_balance is LoadBalance.ZIGZAG:
            parts.append(
                "Zigzag balancing gives every context rank the same causal work; without it the last "
                "rank does nearly twice the average."
            )
        per = self.best_per_strategy()
        others = [f"{s.value} +{r.estimate.step_time_s / e.step_time_s - 1:.1%}" for s, r in per.items() if r.plan != p]
        if others:
            parts.append("Best of the other strategies: " + ", ".join(others) + ".")
        experts = self.expert_text()
        if experts:
            parts.append(experts)
        parts.append(self._remat_text())
        cores = self.cores_text()
        if cores:
            parts.append(cores)
        return " ".join(parts)

    def expert_text(self) -> str | None:
        """For a model with experts, why the expert axis has the size it has beside the context axes: the chosen
        size, what its dispatch costs, and the best feasible plan without expert parallelism (or, where the
        chosen plan has none, with the smallest size that has one) against it (None for a dense model)."""
        p, e = self.best, self.estimate
        experts = p.model.experts
        if not experts:
            return None
        size, index = p.axis_size("expert"), AXES.index("expert")
        context = f"context {p.axis_size('context')} × context_ulysses {p.axis_size('context_ulysses')}"
        if size > 1:
            dispatch = e.comm_s.get("expert_all_to_all", 0.0)
            chosen = (
                f"Expert parallelism: expert={size} gives each device {experts.count // size} of the "
                f"{experts.count} experts (dispatch and return all-to-alls {_s(dispatch)} a step, not overlapped) "
                f"beside {context}"
            )
            other = self.result.ranked.best_where(lambda sizes: sizes[index] == 1)
            what = "without expert parallelism"
        else:
            chosen = f"Expert parallelism: none (expert=1: every device runs every expert) beside {context}"
            larger = sorted({sizes[index] for sizes in self.result.ranked.mesh_sizes() if sizes[index] > 1})
            other = larger and self.result.ranked.best_where(lambda sizes: sizes[index] == larger[0])
            what = f"with expert={larger[0]}" if larger else ""
        if not other:
            return chosen + (f"; no feasible plan {what}." if what else "; no feasible plan with expert > 1.")
        slower = other.estimate.step_time_s / e.step_time_s - 1
        return (
            f"{chosen}; the best plan {what} takes {_s(other.estimate.step_time_s)} (+{slower:.1%}, "
            f"{why_slower(other.estimate, e)}) [{short(other.plan)}]."
        )

    @functools.cached_property
    def backward_cores(self) -> dict | None:
        """Where a device is several TensorCores (v5p's megacore): how many the chosen plan's splash backward
        keeps busy on each runtime, and the plan's step on the other one (None on a one-core device). The
        backward's kernels let the compiler split only what their calls are vmapped over: MaxText's calls
        the device's sequences, cpplan's runtime also groups of a sequence's KV heads (docs/measurements.md,
        "Which TensorCores splash's backward runs on")."""
        p, e, target = self.best, self.estimate, self.result.target
        x = candidates_of(p)
        cores = x.topology.chip.cores_per_device
        if cores == 1:
            return None
        other = Target.MAXTEXT if target is Target.CPPLAN else Target.CPPLAN
        layout = STRATEGIES[p.cp_strategy].layout(x)
        busy = {
            t.value: float(cores * backward_core_share(vmapped_rows(x, layout, TRAITS[t]), cores)[0])
            for t in (Target.CPPLAN, Target.MAXTEXT)
        }
        runs = (other is Target.CPPLAN and not model_refusal(other, p.model)) or (
            other is Target.MAXTEXT and not maxtext_problems(p)
        )
        other_step = estimate(p, target=other).step_time_s if runs else None  # else a plan only this runtime runs
        return {
            "cores_per_device": cores,
            "busy_cores": busy,
            "sequences_per_device": float(x.sequences_per_device[0]),
            "other_target": other.value,
            "other_step_time_s": other_step,
            "step_time_s": e.step_time_s,
        }

    def cores_text(self) -> str | None:
        """`backward_cores` in a sentence, where a runtime leaves some of a device's cores idle in it."""
        c = self.backward_cores
        if c is None or min(c["busy_cores"].values()) == c["cores_per_device"]:
            return None
        n, seqs = c["cores_per_device"], c["sequences_per_device"]
        ours, theirs = c["busy_cores"]["cpplan"], c["busy_cores"]["maxtext"]
        text = (
            f"Each device is {n} TensorCores, and splash's backward splits only what its calls are vmapped over: "
            f"MaxText vmaps them over the device's {seqs:g} sequence{'s' if seqs != 1 else ''}, keeping {theirs:g} "
            f"busy; cpplan's runtime also over groups of a sequence's KV heads, keeping {ours:g}"
        )
        if c["other_step_time_s"] is not None and ours != theirs:
            ratio = c["other_step_time_s"] / c["step_time_s"] - 1
            text += f"; this plan on {c['other_target']} takes {_s(c['other_step_time_s'])} ({ratio:+.0%})"
        if theirs < n:
            text += f". {int(np.ceil(n / seqs))}× the sequences per device would keep all {n} busy on both"
        return text + "."

    def _remat_text(self) -> str:
        """How the chosen remat compares with the other policies on the same mesh and strategy."""
        p, e = self.best, self.estimate
        same = (p.mesh, p.cp_strategy, p.load_balance)
        notes = []
        # the plans of the same mesh, strategy and balancing, found in the ranking: only those are built
        alike = self.result.ranked.where(
            lambda entry: (tuple(zip(AXES, entry.sizes)), entry.strategy, entry.load_balance) == same
        )
        for r in alike:
            if r.plan.remat_label != p.remat_label:
                notes.append(f"{r.plan.remat_label} fits but is {r.estimate.step_time_s / e.step_time_s - 1:+.1%}")
        for rej in self.result.rejections:
            if (tuple(rej.mesh.items()), rej.strategy, rej.load_balance) == same and rej.remat is not None:
                notes.append(f"{remat_label(rej.remat, rej.remat_custom)} {rej.reason}")
        tail = f" ({'; '.join(notes)})" if notes else ""
        return f"Remat {p.remat_label} uses {_gib(e.hbm_bytes_per_device)} of {_gib(e.hbm_capacity_bytes)}{tail}."

    def nothing_fits_text(self) -> str:
        """Per strategy why nothing fits, and what would."""
        res = self.result
        case = res.case
        lines = [
            f"No plan fits {case.model.name} at {format_tokens(case.seq_len)} tokens × "
            f"{counted(case.global_batch, 'sequence')} per step on {case.topology.name}."
        ]
        by_strategy = self.rejections_by_strategy()
        least = {r.plan.cp_strategy: r for r in res.best_infeasible}
        for strategy in CPStrategy:
            if strategy not in res.options.strategies:
                continue
            reasons = ", ".join(f"{c} ×{n}" for c, n in by_strategy.get(strategy, Counter()).most_common())
            line = f"  {strategy.value:<11} rejected: {reasons or 'no candidate'}"
            if strategy in least:
                e = least[strategy].estimate
                line += (
                    f"; the least memory any of its candidates needs is {_gib(e.hbm_bytes_per_device)} "
                    f"of {_gib(e.hbm_capacity_bytes)} [{short(least[strategy].plan)}]"
                )
            lines.append(line)
        lines.append("What would fit:")
        lines += [f"  - {s}" for s in self.suggestions()]
        return "\n".join(lines)

    def advice(self) -> list:
        """The changes that would make a plan fit, each searched again (`planner.suggest.Advice`);
        empty when a plan fits."""
        if self._advice is None:
            from planner.suggest import advice

            self._advice = [] if self.best else advice(self.result)
        return self._advice

    def suggestions(self) -> list[str]:
        """The advice as lines of text."""
        from planner.suggest import lines

        return lines(self.result, self.advice())

    # -- machines --------------------------------------------------------------------
    def to_dict(self) -> dict:
        res = self.result

        def ranked(r: Ranked) -> dict:
            return {
                "plan": r.plan.to_dict(),
                "estimate": r.estimate.to_dict(),
                "summary": short(r.plan),
                "scoped_vmem_limit_kib": r.plan.scoped_vmem_limit_kib,
            }

        return (
            {
                "model": res.case.model.to_dict(),
                "seq_len": res.case.seq_len,
                "global_batch": res.case.global_batch,
                "topology": res.case.topology.name,
                "num_devices": res.case.topology.num_devices,
                "best": ranked(res.best) if res.best else None,
                "alternatives": [
                    dict(
                        ranked(r),
                        slower_than_best=r.estimate.step_time_s / self.estimate.step_time_s - 1,
                        why=why_slower(r.estimate, self.estimate),
                        tie=is_tie(r.estimate, self.estimate, self.error_band),
                        tie_breakers=tie_breakers(r, res.best),
                    )
                    for r in self.alternatives
                ],
                "error_band": self.error_band.to_dict() if self.error_band else None,
                "ties": len(self.ties()),
                "best_per_strategy": {s.value: ranked(r) for s, r in self.best_per_strategy().items()},
                "feasible": len(res.ranked),
                "feasible_plans": [feasible_row(r) for r in res.ranked],
                "priced": res.candidates_priced,
                "rejections": {c: {"count": n, "example": ex} for c, (n, ex) in self.rejection_groups().items()},
                "why": self.why_text() if res.best else None,
                "backward_cores": self.backward_cores if res.best else None,
                "local_layers": self.local_layers,
                "batch_note": res.batch_note,
                "mask_note": res.mask_note,
                "nothing_fits": None if res.best else self.nothing_fits_text(),
                "advice": [
                    {
                        "change": a.change,
                        "seq_len": a.seq_len,
                        "topology": a.topology,
                        "options": a.options,
                        "step_time_s": a.found.best.estimate.step_time_s,
                    }
                    for a in self.advice()
                ],
            }
            | ({"dcn": dcn_traffic(self.best, self.estimate)} if self.best and self.best.num_slices > 1 else {})
            | ({"documents": self.documents} if self.documents else {})
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
