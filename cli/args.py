"""Argument parsing shared by the commands: the parser, flag types, and the planning flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys

from cost_models.errors import CpplanError
from cost_models.models import ModelSpec, get_model
from cost_models.remat import SEARCHED_CUSTOM, SEARCHED_POLICIES
from cost_models.strategies.base import full_mask_balance_problem, maxtext_mask_problems
from cost_models.targets import Target
from cost_models.vocabulary import DTYPE_BYTES, CPStrategy, LoadBalance, Quantization, RematPolicy
from planner import api
from planner.options import DEFAULT_LOSS_CHUNK_TOKENS, DOC_LENGTHS_FORMS, parse_doc_lengths, parse_seq_len

FULL_MASK_HELP = (
    "plan the model with a full (non-causal) attention mask: every query sees every key, as in an "
    "encoder (a config.json says so with is_causal: false), so attention computes every query-key pair, "
    "twice a causal model's FLOPs; zigzag load balancing has nothing to even out and is not searched "
    "(--load-balance zigzag alone is refused), and MaxText runs its decoders causal, so --target "
    "maxtext and export --format maxtext are refused"
)


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other cpplan error."""

    def error(self, message: str):
        self.exit(2, f"cpplan: error: {message} (see `{self.prog} --help`)\n")


class HelpWithDefaults(argparse.HelpFormatter):
    """Help that states each flag's default, where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


# the largest count a flag takes: steps, checkpoints, process ids and token counts reach the runtime
# as jax's 32-bit integers, where a larger one wraps round
LARGEST_COUNT = 2**31 - 1


def directory(text: str) -> str:
    """An argparse type: a directory's path, not empty (an empty one would name no place to write)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no directory: give one, e.g. cpplan-run")
    return text


def at_least(low: int):
    """An argparse type: an integer of at least `low` and at most `LARGEST_COUNT`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        if value > LARGEST_COUNT:
            raise argparse.ArgumentTypeError(f"{value} must be at most {LARGEST_COUNT} (2**31 - 1)")
        return value

    parse.__name__ = f"integer ≥ {low}"
    return parse


# `run`'s optimizer flags (`runtime.optimizer.AdamW`): the field each sets, by flag destination
OPTIMIZER_FLAGS = {
    "learning_rate": "learning_rate",
    "warmup_steps": "warmup_steps",
    "decay": "decay",
    "final_lr_fraction": "final_fraction",
    "weight_decay": "weight_decay",
    "clip_norm": "clip_norm",
}


def add_optimizer_options(p: argparse.ArgumentParser) -> None:
    """The optimizer flags of a command that trains: AdamW with MaxText 0.2.5's defaults (each named)."""
    from runtime.optimizer import AdamW, Decay

    p.add_argument(
        "--learning-rate",
        type=float,
        metavar="LR",
        help=f"the peak learning rate, reached at the warmup's end (MaxText's learning_rate; default "
        f"{AdamW.learning_rate:g})",
    )
    p.add_argument(
        "--warmup-steps",
        type=at_least(0),
        help="steps of the rate's linear rise from 0 (default: a tenth of --steps, rounded down: MaxText's "
        "warmup_steps_fraction 0.1)",
    )
    p.add_argument(
        "--decay",
        choices=[d.value for d in Decay],
        help=f"how the rate falls after the warmup, to --final-lr-fraction of the peak at the last step "
        f"(default {AdamW.decay.value}, MaxText's lr_schedule_type)",
    )
    p.add_argument(
        "--final-lr-fraction",
        type=float,
        metavar="FRACTION",
        help=f"the rate at the last step as a fraction of --learning-rate, 0 to 1 (MaxText's "
        f"learning_rate_final_fraction; default {AdamW.final_fraction:g})",
    )
    p.add_argument(
        "--weight-decay",
        type=float,
        help=f"AdamW's weight decay (MaxText's adam_weight_decay; default {AdamW.weight_decay:g})",
    )
    p.add_argument(
        "--clip-norm",
        type=float,
        metavar="NORM",
        help=f"clip the gradients to this global norm before the update, 0: no clipping (MaxText's "
        f"gradient_clipping_threshold; default {AdamW.clip_norm:g})",
    )


def optimizer_of(args: argparse.Namespace):
    """The `runtime.optimizer.AdamW` of the optimizer flags given, over `--steps`.

    Raises:
        CpplanError: a value out of its range, or --final-lr-fraction with --decay constant.
    """
    from runtime.optimizer import AdamW

    if args.decay == "constant" and args.final_lr_fraction is not None:
        raise CpplanError(
            f"--final-lr-fraction {args.final_lr_fraction:g} with --decay constant: a constant rate falls to no "
            f"floor; drop --final-lr-fraction, or choose --decay cosine or linear."
        )
    given = {field: getattr(args, dest) for dest, field in OPTIMIZER_FLAGS.items() if getattr(args, dest) is not None}
    return AdamW(steps=args.steps, **given)


def csv_words(text: str | None) -> list[str] | None:
    return [w.strip() for w in text.split(",") if w.strip()] if text is not None else None


def seq_lens(text: str) -> list[int]:
    """--seq-lens: comma-separated lengths, each given (an empty item is a typo, not a length to skip).

    Raises:
        CpplanError: no length, an empty item, or a length that does not parse.
    """
    words = [w.strip() for w in text.split(",")]
    if not any(words):
        raise CpplanError(f"--seq-lens {text!r} names no length; give comma-separated lengths, e.g. 2k,8k.")
    if not all(words):
        raise CpplanError(
            f"--seq-lens {text!r} has an empty item (item {words.index('') + 1}); give each length once between "
            f"commas, e.g. {','.join(w for w in words if w)}."
        )
    return [parse_seq_len(w) for w in words]


def block_sizes(text: str | None) -> list[int]:
    """--blocks: comma-separated splash block sizes, powers of two from 128 (none: an empty list).

    Raises:
        CpplanError: an item that is not one.
    """
    blocks = []
    for word in csv_words(text) or []:
        if not word.isdigit() or int(word) < 128 or int(word) & (int(word) - 1):
            raise CpplanError(
                f"--blocks {text!r}: {word!r} is not a splash block; give powers of two from 128, e.g. 1024,2048."
            )
        blocks.append(int(word))
    return blocks


def mesh_sizes(text: str | None) -> dict[str, int] | None:
    if text is None:
        return None
    mesh = {}
    for word in csv_words(text) or [""]:
        axis, _, size = (part.strip() for part in word.partition("="))
        if not re.fullmatch(r"[0-9]+", size):
            raise CpplanError(f"--mesh {word!r}: write AXIS=SIZE pairs separated by commas, e.g. context=16,tensor=2.")
        if axis in mesh:
            raise CpplanError(f"--mesh gives axis {axis!r} twice ({mesh[axis]} and {size}); give each axis once.")
        mesh[axis] = int(size)
    return mesh


def to_json(data) -> str:
    """Strict JSON (no NaN or infinity) for --json output."""
    return json.dumps(data, indent=2, allow_nan=False, default=str)


def add_search_options(p: argparse.ArgumentParser, *, seq_len: bool = True, batch: bool = True) -> None:
    """The flags every command that plans takes (`batch`: the batch flags, for a command that does not
    choose the sequences per step itself)."""
    p.add_argument("--model", required=True, help="model name (e.g. llama3.1-8b) or path to a config.json")
    p.add_argument("--full-mask", action="store_true", help=FULL_MASK_HELP)
    p.add_argument(
        "--doc-lengths",
        metavar="LENGTHS",
        help=f"rows packed from documents, no query seeing another: {DOC_LENGTHS_FORMS}, or data (the "
        "documents cpplan's packer marks in --data, with --eos-id unless ArrayRecord). A fixed length is a "
        "static mask every kernel skips blocks by; documents of varying length are marked by segment ids "
        "only, which cpplan's runtime (every strategy) and MaxText's ulysses (tokamax's splash) prune tiles "
        "by, priced as the expected tiles left, and MaxText's other strategies compute as whole rows",
    )
    p.add_argument(
        "--data",
        help="tokens: a text file (bytes), a .npy or raw token file, ArrayRecord; `run` trains on them "
        "(default synthetic tokens), and --doc-lengths data measures their documents",
    )
    p.add_argument("--data-dtype", choices=["uint16", "uint32"], help="token type of raw and ArrayRecord --data")
    p.add_argument("--eos-id", type=at_least(0), help="the token that ends each document of --data")
    if seq_len:
        p.add_argument("--seq-len", required=True, help="tokens per sequence: 131072, 128k, 4M")
    p.add_argument("--topology", required=True, help="e.g. v5p-256, v5p:4x4x8, tpu7x-128, cpu:8")
    p.add_argument("--strategies", help=f"allowed strategies: {','.join(s.value for s in CPStrategy)}")
    p.add_argument("--mesh", help="fixed axis sizes, e.g. context=16,tensor=2")
    others = [r.value for r in RematPolicy if r not in SEARCHED_POLICIES]
    preset = " ".join(f"{n}={w.value}" for n, w in SEARCHED_CUSTOM[0])
    p.add_argument(
        "--remat",
        help=f"allowed remat policies, MaxText's names (default "
        f"{','.join(p.value for p in SEARCHED_POLICIES)}; custom is {preset}): also {', '.join(others)}",
    )
    p.add_argument("--param-dtype", choices=sorted(DTYPE_BYTES), help="weights and gradients (default float32)")
    p.add_argument(
        "--mu-dtype",
        choices=sorted(DTYPE_BYTES),
        help="AdamW's first moment (MaxText's mu_dtype; default float32); the second is in --param-dtype",
    )
    p.add_argument(
        "--quantization",
        choices=[q.value for q in Quantization],
        help="the matmuls' precision (MaxText's quantization): none (bf16, the default) or fp8_full (fp8 on a chip "
        "whose row gives an fp8 peak)",
    )
    p.add_argument("--load-balance", help="allowed load balancing: zigzag,none")
    if batch:
        p.add_argument(
            "--global-batch-tokens",
            help="tokens per step to aim for: the search picks the number of sequences "
            "nearest it that a plan fits (default max(seq_len, 4M); one sequence on "
            "cpu:N)",
        )
        p.add_argument(
            "--exact-batch", type=at_least(1), help="exactly this many sequences per step (instead of a target)"
        )
    p.add_argument(
        "--loss-chunk-tokens",
        help=f"cross-entropy chunk in tokens (8192, 8k); 0 = full logits (default {DEFAULT_LOSS_CHUNK_TOKENS})",
    )
    p.add_argument(
        "--num-slices",
        type=at_least(1),
        help="slices of --topology joined over DCN (data and fsdp span them; default 1)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output: strict JSON alone")


def search_options(args: argparse.Namespace) -> dict:
    """Planner keyword options from parsed flags (only those given)."""
    opts = {
        "strategies": csv_words(args.strategies),
        "mesh": mesh_sizes(args.mesh),
        "remat": csv_words(args.remat),
        "load_balance": csv_words(args.load_balance),
        "global_batch_tokens": getattr(args, "global_batch_tokens", None),
        "global_batch": getattr(args, "exact_batch", None),
        "loss_chunk_tokens": args.loss_chunk_tokens,
        "num_slices": args.num_slices,
        "param_dtype": args.param_dtype,
        "mu_dtype": args.mu_dtype,
        "quantization": args.quantization,
    }
    if getattr(args, "target", None):
        opts["target"] = args.target
    return {k: v for k, v in opts.items() if v is not None}


def add_html(p: argparse.ArgumentParser) -> None:
    """The --html flag of the commands that draw a report."""
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report (opens offline; needs the report extra: "
        "pip install 'cpplan[report]')",
    )


def html_target(args: argparse.Namespace):
    """--html's path, proved writable (and plotly importable) before any work; None without --html."""
    if getattr(args, "html", None) is None:
        return None
    from validation.html_report.page import check_writable

    return check_writable(args.html)


def write_html(data, path, source: str | None = None, **options) -> None:
    """Draws the report of `data` (a dict or rows as --json prints them; `source` names it in errors)
    into `path`."""
    from validation.html_report.draw import page_of
    from validation.html_report.page import write

    write(page_of(data, source or f"--html {str(path)!r}", **options), path)
    print(f"wrote {path}", file=sys.stderr)


def add_target(p: argparse.ArgumentParser, default_text: str = "cpplan") -> None:
    """The --target flag of the commands that price for a runtime."""
    p.add_argument(
        "--target",
        choices=[t.value for t in Target],
        help=f"the runtime priced: cpplan's own, or MaxText 0.2.5 (its memory; only plans it accepts) "
        f"(default: {default_text})",
    )


def model_of(args: argparse.Namespace) -> ModelSpec:
    """The model a command plans: `--model`, with a full (non-causal) mask under `--full-mask`,
    refused up front where another flag asks for what a full mask cannot have, or for MaxText where
    no strategy of MaxText's runs the model's masks.

    Raises:
        CpplanError: an unknown model; a full-mask model with only zigzag balancing allowed; a model
            whose masks MaxText runs under no strategy, priced or exported for MaxText.
    """
    model, full_mask = get_model(args.model), getattr(args, "full_mask", False)
    if full_mask:
        model = dataclasses.replace(model, causal=False)
    if getattr(args, "doc_lengths", None) is not None:
        model = dataclasses.replace(model, documents=doc_lengths_of(args))
    for_maxtext = "maxtext" in (getattr(args, "format", None), getattr(args, "target", None))
    if model.causal and not for_maxtext:  # nothing below asks anything of it
        return model
    unexportable = maxtext_mask_problems(model)  # what no strategy lifts: a full mask, local layers no block has
    if model.causal and not unexportable:
        return model
    source = "--full-mask" if full_mask else f"--model {args.model}" + ("" if model.causal else " (is_causal: false)")
    balancing = getattr(args, "load_balance", None)
    if (
        not model.causal
        and balancing is not None
        and {LoadBalance.parse(w) for w in csv_words(balancing)} == {LoadBalance.ZIGZAG}
    ):
        raise CpplanError(
            f"--load-balance {balancing} with {source}: {full_mask_balance_problem(model, True)}; "
            f"allow none (--load-balance none, or leave the flag out)."
        )
    for flag, value, fix in (
        ("--format", getattr(args, "format", None), "--format json writes the plan for cpplan's runtime"),
        ("--target", getattr(args, "target", None), "leave out --target maxtext to price it"),
    ):
        if value == "maxtext":
            raise CpplanError(f"{flag} maxtext with {source}: {unexportable[0]}; {fix}.")
    return model


MEASURED = "data"  # --doc-lengths data: the documents of --data


def doc_lengths_of(args: argparse.Namespace):
    """--doc-lengths as `ModelSpec.documents`: parsed, or measured from --data by the runtime's packer.

    Raises:
        CpplanError: a form not listed, or `data` without a data file whose documents are marked.
    """
    if args.doc_lengths.strip().lower() != MEASURED:
        return parse_doc_lengths(args.doc_lengths)
    if not args.data:
        raise CpplanError(
            "--doc-lengths data measures the documents of --data: give --data FILE (with --eos-id unless it is "
            "ArrayRecord), or give the lengths themselves: " + DOC_LENGTHS_FORMS + "."
        )
    from runtime.data import measure_documents

    return measure_documents(args.data, dtype=args.data_dtype, eos_id=args.eos_id)


def plan_of(args: argparse.Namespace):
    return api.plan(model_of(args), args.seq_len, args.topology, **search_options(args))


def add_command(sub, name: str, handler, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name, help=help_text, description=help_text, allow_abbrev=False, formatter_class=HelpWithDefaults
    )
    p.set_defaults(func=handler)
    return p
