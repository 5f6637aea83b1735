"""Validation reports: per-plan rows, summary figures, and the files a person reads (markdown,
JSON, plots)."""

from __future__ import annotations

import io
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.errors import CpplanError
from cost_models.estimate import Estimate
from cost_models.topology import get_topology
from cost_models.units import GiB
from planner.plan import Plan
from validation.outputs import prepare_out_dir, write_atomic
from validation.stats import mape, regret, spearman

# the files each report writes under --out; the runs' measurements go to MEASUREMENTS_FILE as they finish
MEASUREMENTS_FILE = "measurements.jsonl"
STEP_REPORT_FILES = ("report.json", "report.md", "predicted_vs_measured.png", "winners.png", MEASUREMENTS_FILE)
MEMORY_REPORT_FILES = ("memory.json", "memory.md")
CORPUS_REPORT_FILES = ("report.json", "report.md", "predicted_vs_measured.png", "errors.png")


def _pyplot():
    """matplotlib's pyplot on the Agg backend.

    Raises:
        CpplanError: matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError:
        raise CpplanError(
            "plots need matplotlib, which is not installed; pip install matplotlib "
            "(or write the report without plots: --no-plots)."
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _predicted_vs_measured(plt, done: list, *, group, xlabel: str, title: str, path: Path) -> Path:
    """Predicted against measured step time on log axes, one colour per `group(result)`; saved at `path`."""
    fig, ax = plt.subplots(figsize=(6, 6))
    for name in sorted({group(r) for r in done}):
        pts = [(r.measured_step_s, r.predicted.step_time_s) for r in done if group(r) == name]
        ax.scatter(*zip(*pts), label=name, alpha=0.8)
    if done:
        lo = min(min(r.measured_step_s, r.predicted.step_time_s) for r in done) * 0.8
        hi = max(max(r.measured_step_s, r.predicted.step_time_s) for r in done) * 1.25
        ax.plot([lo, hi], [lo, hi], "k--", linewidth=1, label="predicted = measured")
        ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlim(lo, hi), ax.set_ylim(lo, hi)
    ax.set_xlabel(f"{xlabel} step time (s)"), ax.set_ylabel("predicted step time (s)")
    ax.set_title(title), ax.legend()
    _save_figure(fig, path)
    plt.close(fig)
    return path


def _save_figure(fig, path: Path) -> None:
    """A figure as PNG, written atomically like every report file."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buffer.getvalue())


def _finite(value: float) -> float | None:
    """A statistic, or None where it is undefined (too few plans measured): reports hold no NaN."""
    return value if math.isfinite(value) else None


def _shown(value: float | None, spec: str) -> str:
    """A statistic for people: formatted, or n/a where it is undefined."""
    return "n/a" if value is None else format(value, spec)


def _counted(run_ids: list[str]) -> str:
    """'2 (a, b)', or '0'."""
    return f"{len(run_ids)}" + (f" ({', '.join(run_ids)})" if run_ids else "")


def plan_label(plan: Plan) -> str:
    """A measured plan's name in reports and journals: strategy, mesh, remat policy, blocks, backward."""
    mesh = " ".join(f"{a}={s}" for a, s in plan.mesh if s > 1) or "1 device"
    zig = " zigzag" if plan.load_balance.value == "zigzag" else ""
    fused = ", fused backward" if plan.fused_attention_backward else ""
    return f"{plan.strategy_label}{zig} [{mesh}] {plan.remat.value}, blocks {plan.block_q}{fused}"


@dataclass
class StepResult:
    """One plan: predicted against measured step time."""

    plan: Plan
    predicted: Estimate
    measured_step_s: float | None = None
    measured_mfu: float | None = None
    source: str = "run"
    failure: str | None = None
    measured_median_s: float | None = None  # of a run's steps after the first, beside its fastest
    run_id: str | None = None  # a corpus run's name
    notes: tuple[str, ...] = ()  # how a published run was priced where cpplan lacks its setting

    @property
    def error(self) -> float | None:
        if self.measured_step_s is None:
            return None
        return self.predicted.step_time_s / self.measured_step_s - 1

    @property
    def impossible(self) -> bool:
        """A measured step faster than the chip's peak allows (MFU above 100%): a wrong figure, not a
        fast plan; flagged and left out of the statistics."""
        return self.measured_mfu is not None and self.measured_mfu > 1

    def to_dict(self) -> dict:
        return {
            "plan": self.plan.to_dict(),
            "label": plan_label(self.plan),
            "seq_len": self.plan.seq_len,
            "strategy": self.plan.cp_strategy.value,
            "predicted_step_s": self.predicted.step_time_s,
            "measured_step_s": self.measured_step_s,
            "error": self.error,
            "predicted_mfu": self.predicted.mfu,
            "measured_mfu": self.measured_mfu,
            "measured_median_s": self.measured_median_s,
            "source": self.source,
            "failure": self.failure,
            "run_id": self.run_id,
            "notes": list(self.notes),
            "chip": get_topology(self.plan.topology).chip.name,
            "fits": self.predicted.fits,
            "verdict": self.predicted.verdict,
            "impossible": self.impossible,
        }


@dataclass
class StepTimeReport:
    """Predicted vs measured step times of many plans."""

    title: str
    results: list[StepResult] = field(default_factory=list)
    interrupted: bool = False

    @property
    def measured(self) -> list[StepResult]:
        """The plans measured with a figure the chip can reach (`StepResult.impossible` left out)."""
        return [r for r in self.results if r.measured_step_s is not None and not r.impossible]

    @property
    def impossible(self) -> list[StepResult]:
        return [r for r in self.results if r.impossible]

    def by_seq_len(self) -> dict[int, list[StepResult]]:
        groups: dict[int, list[StepResult]] = defaultdict(list)
        for r in self.measured:
            groups[r.plan.seq_len].append(r)
        return dict(sorted(groups.items()))

    def summary(self) -> dict:
        done = self.measured
        pred = [r.predicted.step_time_s for r in done]
        meas = [r.measured_step_s for r in done]
        regrets = {
            s: regret([r.predicted.step_time_s for r in g], [r.measured_step_s for r in g])
            for s, g in self.by_seq_len().items()
        }
        winners = {}
        for s, g in self.by_seq_len().items():
            winners[s] = {
                "predicted": min(g, key=lambda r: r.predicted.step_time_s).plan.cp_strategy.value,
                "measured": min(g, key=lambda r: r.measured_step_s).plan.cp_strategy.value,
            }
        return {
            "mape": _finite(mape(pred, meas)),
            "spearman": _finite(spearman(pred, meas)),
            "regret": _finite(max(regrets.values())) if regrets else None,
            "regret_per_seq_len": {s: _finite(r) for s, r in regrets.items()},
            "winners": winners,
            "plans_measured": len(done),
            "plans_failed": sum(r.failure is not None for r in self.results),
            "plans_impossible": len(self.impossible),
            "strategies": sorted({r.plan.cp_strategy.value for r in done}),
            "interrupted": self.interrupted,
        }

    def to_dict(self) -> dict:
        s = self.summary()
        return {
            "title": self.title,
            "mape": s["mape"],
            "spearman": s["spearman"],
            "regret": s["regret"],
            "summary": s,
            "plans": [r.to_dict() for r in self.results],
        }

    def markdown(self, *, plots: bool = True) -> str:
        """The report for people; `plots` links the figures `write` draws beside it."""
        s = self.summary()
        lines = [
            f"# {self.title}",
            "",
            f"- plans measured: {s['plans_measured']} ({', '.join(s['strategies'])}); failed: {s['plans_failed']}"
            + ("; **interrupted**, partial results" if s["interrupted"] else ""),
            *(
                [
                    "- **left out as impossible** (measured MFU above 100%: check the figure): "
                    + ", ".join(f"{plan_label(r.plan)} at {r.measured_mfu:.0%}" for r in self.impossible)
                ]
                if self.impossible
                else []
            ),
            f"- step time MAPE: **{_shown(s['mape'], '.1%')}**",
            f"- Spearman rank correlation: **{_shown(s['spearman'], '.3f')}**",
            f"- regret (measured time of the predicted-best plan ÷ best measured), worst over lengths: "
            f"**{_shown(s['regret'], '.3f')}**",
            "",
            "| seq_len | predicted winner | measured winner | regret |",
            "|---|---|---|---|",
        ]
        for seq, w in s["winners"].items():
            lines.append(
                f"| {seq} | {w['predicted']} | {w['measured']} | {_shown(s['regret_per_seq_len'][seq], '.3f')} |"
            )
        lines += [
            "",
            "Measured: a run's fastest step after the first (calibration keeps its fastest run too: work "
            "sharing the host only ever adds time); the median is in the JSON.",
            "",
            "| plan | seq_len | predicted s | measured s | error | predicted MFU | measured MFU |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in sorted(self.results, key=lambda r: (r.plan.seq_len, r.predicted.step_time_s)):
            if r.measured_step_s is None:
                lines.append(
                    f"| {plan_label(r.plan)} | {r.plan.seq_len} | {r.predicted.step_time_s:.4f} | "
                    f"failed: {r.failure} | | | |"
                )
                continue
            mfu = f"{r.measured_mfu:.2%}" if r.measured_mfu is not None else "–"
            lines.append(
                f"| {plan_label(r.plan)} | {r.plan.seq_len} | {r.predicted.step_time_s:.4f} | "
                f"{r.measured_step_s:.4f} | {r.error:+.1%} | {r.predicted.mfu:.2%} | {mfu} |"
            )
        if plots:
            lines += ["", "![predicted vs measured](predicted_vs_measured.png)", "", "![winners](winners.png)"]
        return "\n".join(lines + [""])

    def plot(self, outdir: Path) -> list[Path]:
        """Draws predicted against measured per plan, and each length's winners, as PNGs.

        Args:
            outdir: an existing directory for the two files.
        Returns:
            The paths written.
        Raises:
            CpplanError: matplotlib is not installed.
        """
        plt = _pyplot()
        done = self.measured
        paths = [
            _predicted_vs_measured(
                plt,
                done,
                group=lambda r: r.plan.cp_strategy.value,
                xlabel="measured",
                title="cpplan: predicted vs measured, one point per plan",
                path=outdir / "predicted_vs_measured.png",
            )
        ]

        fig, ax = plt.subplots(figsize=(7, 4))
        groups = self.by_seq_len()
        for offset, kind, key, marker in (
            (-0.1, "predicted", lambda r: r.predicted.step_time_s, "o"),
            (0.1, "measured", lambda r: r.measured_step_s, "s"),
        ):
            xs = [i + offset for i in range(len(groups))]
            ys = [min(g, key=key).plan.cp_strategy.value for g in groups.values()]
            ax.scatter(xs, ys, label=kind, s=80, marker=marker)
        ax.set_xticks(range(len(groups)), [str(s) for s in groups])
        ax.set_xlabel("sequence length"), ax.set_ylabel("fastest strategy"), ax.legend()
        ax.set_title("which strategy wins at each length: predicted vs measured")
        paths.append(outdir / "winners.png")
        _save_figure(fig, paths[-1])
        plt.close(fig)
        return paths

    def write(self, outdir: "str | Path", *, plots: bool = True) -> list[Path]:
        """Writes report.json, report.md and (with `plots`) the two figures under `outdir`.

        Args:
            outdir: directory, created if missing.
            plots: draw the figures too (needs matplotlib).
        Returns:
            The paths written.
        Raises:
            CpplanError: `plots` without matplotlib installed.
        """
        outdir = prepare_out_dir(outdir, STEP_REPORT_FILES)
        write_atomic(outdir / "report.json", json.dumps(self.to_dict(), indent=2, default=str, allow_nan=False))
        write_atomic(outdir / "report.md", self.markdown(plots=plots))
        return [outdir / "report.json", outdir / "report.md", *(self.plot(outdir) if plots else [])]


@dataclass
class CorpusReport(StepTimeReport):
    """Predicted vs published step times of a corpus of runs on different models and chips: the
    error of every run, MAPE overall and per chip, the Spearman correlation of MFU, the worst runs."""

    worst: int = 5

    def chip_of(self, r: StepResult) -> str:
        return get_topology(r.plan.topology).chip.name

    def summary(self) -> dict:
        done = self.measured
        by_chip: dict[str, list[StepResult]] = defaultdict(list)
        for r in done:
            by_chip[self.chip_of(r)].append(r)
        worst = sorted(done, key=lambda r: -abs(r.error))[: self.worst]
        errors = [abs(r.error) for r in done]
        return {
            "runs": len(done),
            "mape": _finite(mape([r.predicted.step_time_s for r in done], [r.measured_step_s for r in done])),
            "max_abs_error": max(errors) if errors else None,
            "within_15pct": sum(e <= 0.15 for e in errors),
            "spearman_mfu": _finite(spearman([r.predicted.mfu for r in done], [r.measured_mfu for r in done])),
            "mean_signed_error": sum(r.error for r in done) / len(done) if done else None,
            "per_chip": {
                chip: {
                    "runs": len(g),
                    "mape": _finite(mape([r.predicted.step_time_s for r in g], [r.measured_step_s for r in g])),
                    "max_abs_error": max(abs(r.error) for r in g),
                    "mean_signed_error": sum(r.error for r in g) / len(g),
                    "spearman_mfu": _finite(spearman([r.predicted.mfu for r in g], [r.measured_mfu for r in g])),
                }
                for chip, g in sorted(by_chip.items())
            },
            "worst": [{"run": r.run_id, "error": r.error} for r in worst],
            "do_not_fit": [r.run_id for r in done if not r.predicted.fits and not r.predicted.marginal],
            "do_not_fit_marginally": [r.run_id for r in done if not r.predicted.fits and r.predicted.marginal],
            "approximated": sum(bool(r.notes) for r in done),
            "plans_measured": len(done),
            "plans_failed": sum(r.failure is not None for r in self.results),
            "interrupted": self.interrupted,
        }

    def to_dict(self) -> dict:
        s = self.summary()
        return {
            "title": self.title,
            "mape": s["mape"],
            "spearman_mfu": s["spearman_mfu"],
            "summary": s,
            "plans": [r.to_dict() for r in self.results],
        }

    def markdown(self, *, plots: bool = True) -> str:
        s = self.summary()
        lines = [
            f"# {self.title}",
            "",
            f"- runs: {s['runs']}; step-time MAPE **{_shown(s['mape'], '.1%')}**; largest |error| "
            f"**{_shown(s['max_abs_error'], '.1%')}**; within 15%: **{s['within_15pct']} of {s['runs']}**; "
            f"mean signed error {_shown(s['mean_signed_error'], '+.1%')}",
            f"- Spearman rank correlation of MFU (predicted vs measured): **{_shown(s['spearman_mfu'], '.3f')}**",
            f"- priced at a nearest setting (see notes): {s['approximated']}; cpplan says do not fit: "
            f"{_counted(s['do_not_fit'])}; do not fit as priced, but within the memory price's measured error "
            f"of the capacity: {_counted(s['do_not_fit_marginally'])}",
            "",
            "| chip | runs | MAPE | largest abs. error | mean signed | Spearman of MFU |",
            "|---|---|---|---|---|---|",
        ]
        for chip, c in s["per_chip"].items():
            lines.append(
                f"| {chip} | {c['runs']} | {_shown(c['mape'], '.1%')} | {c['max_abs_error']:.1%} | "
                f"{c['mean_signed_error']:+.1%} | {_shown(c['spearman_mfu'], '.3f')} |"
            )
        lines += [
            "",
            "Worst runs: " + ", ".join(f"{w['run']} {w['error']:+.1%}" for w in s["worst"]),
            "",
            "| run | plan | predicted s | measured s | error | predicted MFU | measured MFU | fits | notes |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            notes = "; ".join(r.notes).replace("|", "/")
            if r.measured_step_s is None:
                lines.append(
                    f"| {r.run_id} | {plan_label(r.plan)} | {r.predicted.step_time_s:.3f} | failed: "
                    f"{r.failure} | | | | | {notes} |"
                )
                continue
            priced_gib = r.predicted.hbm_bytes_per_device / GiB
            fits = "yes" if r.predicted.fits else f"{r.predicted.verdict}: {priced_gib:.0f} GiB"
            lines.append(
                f"| {r.run_id} | {plan_label(r.plan)} | {r.predicted.step_time_s:.3f} | {r.measured_step_s:.3f} "
                f"| {r.error:+.1%} | {r.predicted.mfu:.1%} | {r.measured_mfu:.1%} | {fits} | {notes} |"
            )
        if plots:
            lines += ["", "![predicted vs measured](predicted_vs_measured.png)", "", "![errors](errors.png)"]
        return "\n".join(lines + [""])

    def plot(self, outdir: Path) -> list[Path]:
        """Predicted against measured step time per run (one colour per chip), and every run's error.

        Raises:
            CpplanError: matplotlib is not installed.
        """
        plt = _pyplot()
        done = self.measured
        paths = [
            _predicted_vs_measured(
                plt,
                done,
                group=self.chip_of,
                xlabel="published",
                title="cpplan vs published runs, one point per run",
                path=outdir / "predicted_vs_measured.png",
            )
        ]

        fig, ax = plt.subplots(figsize=(8, max(3, 0.18 * len(done))))
        ax.barh(
            [r.run_id for r in done],
            [100 * r.error for r in done],
            color=["tab:red" if abs(r.error) > 0.15 else "tab:blue" for r in done],
        )
        ax.axvline(0, color="k", linewidth=1)
        ax.set_xlabel("predicted / published step time − 1 (%)"), ax.invert_yaxis()
        ax.set_title("error per run (red: beyond 15%)")
        paths.append(outdir / "errors.png")
        _save_figure(fig, paths[-1])
        plt.close(fig)
        return paths

    def write(self, outdir: "str | Path", *, plots: bool = True) -> list[Path]:
        """Writes report.json, report.md and (with `plots`) the two figures under `outdir`.

        Raises:
            CpplanError: `plots` without matplotlib installed.
        """
        outdir = prepare_out_dir(outdir, CORPUS_REPORT_FILES)
        write_atomic(outdir / "report.json", json.dumps(self.to_dict(), indent=2, default=str, allow_nan=False))
        write_atomic(outdir / "report.md", self.markdown(plots=plots))
        return [outdir / "report.json", outdir / "report.md", *(self.plot(outdir) if plots else [])]


@dataclass
class MemoryResult:
    """One plan: predicted HBM per device against the XLA TPU compiler's."""

    plan: Plan
    predicted: Estimate
    compiled_bytes: float | None
    compiled_fits: bool
    required_bytes: float | None = None  # from CompileTimeHbmOom when it does not fit
    layers_compiled: int | None = None
    failure: str | None = None

    @property
    def error(self) -> float | None:
        actual = self.compiled_bytes if self.compiled_fits else self.required_bytes
        return None if actual is None else self.predicted.hbm_bytes_per_device / actual - 1

    def to_dict(self) -> dict:
        return {
            "plan": self.plan.to_dict(),
            "label": plan_label(self.plan),
            "topology": self.plan.topology,
            "seq_len": self.plan.seq_len,
            "layers": self.plan.model.num_layers,
            "predicted_bytes": self.predicted.hbm_bytes_per_device,
            "predicted_breakdown": self.predicted.hbm_bytes,
            "predicted_fits": self.predicted.fits,
            "compiled_bytes": self.compiled_bytes,
            "compiled_fits": self.compiled_fits,
            "required_bytes": self.required_bytes,
            "error": self.error,
            "failure": self.failure,
        }


@dataclass
class MemoryReport:
    """Predicted vs compiled HBM of many plans."""

    title: str
    results: list[MemoryResult] = field(default_factory=list)

    def summary(self) -> dict:
        done = [r for r in self.results if r.failure is None and r.error is not None]
        agree = [r.predicted.fits == r.compiled_fits for r in self.results if r.failure is None]
        return {
            "plans": len(self.results),
            "compared": len(done),
            "within_10pct": sum(abs(r.error) <= 0.10 for r in done),
            "mean_abs_error": sum(abs(r.error) for r in done) / len(done) if done else None,
            "fit_agreement": sum(agree) / len(agree) if agree else None,
            "topologies": sorted({r.plan.topology for r in self.results}),
        }

    def to_dict(self) -> dict:
        return {"title": self.title, **self.summary(), "plans": [r.to_dict() for r in self.results]}

    def markdown(self) -> str:
        s = self.summary()
        lines = [
            f"# {self.title}",
            "",
            f"- plans: {s['plans']} on {', '.join(s['topologies'])}; within 10% of the compiler: "
            f"**{s['within_10pct']} of {s['compared']}**; mean |error| {_shown(s['mean_abs_error'], '.1%')}",
            f"- fit / no-fit agreement with the compiler: **{_shown(s['fit_agreement'], '.0%')}**",
            "",
            "| plan | topology | seq_len | layers | predicted GiB | compiler GiB | error | fits (pred/compiler) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in self.results:
            actual = r.compiled_bytes if r.compiled_fits else r.required_bytes
            actual_text = "–" if actual is None else f"{actual / GiB:.2f}"
            err = "–" if r.error is None else f"{r.error:+.1%}"
            note = f" ({r.failure})" if r.failure else ""
            lines.append(
                f"| {plan_label(r.plan)} | {r.plan.topology} | {r.plan.seq_len} | {r.plan.model.num_layers} | "
                f"{r.predicted.hbm_bytes_per_device / GiB:.2f} | {actual_text} | {err} | "
                f"{r.predicted.fits}/{r.compiled_fits}{note} |"
            )
        return "\n".join(lines) + "\n"

    def write(self, outdir: "str | Path") -> list[Path]:
        outdir = prepare_out_dir(outdir, MEMORY_REPORT_FILES)
        write_atomic(outdir / "memory.json", json.dumps(self.to_dict(), indent=2, default=str, allow_nan=False))
        write_atomic(outdir / "memory.md", self.markdown())
        return [outdir / "memory.json", outdir / "memory.md"]
