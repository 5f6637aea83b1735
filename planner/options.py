"""User options for a search: parsed, validated, with errors that say what is accepted."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from cost_models.documents import HISTOGRAM_FORMAT, DocumentLengths, DocumentsKind, lognormal, read_histogram
from cost_models.errors import CpplanError
from cost_models.remat import SEARCHED_POLICIES
from cost_models.topology import Topology, divisors
from cost_models.vocabulary import AXES, DTYPE_BYTES, CPStrategy, LoadBalance, Quantization, RematPolicy

# Llama 3 pre-training started at a global batch of 4M tokens (Llama 3 paper, §3.4.1).
DEFAULT_GLOBAL_BATCH_TOKENS = 4 * 1024 * 1024
DEFAULT_LOSS_CHUNK_TOKENS = 8192
_SUFFIX = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def check_mesh(mesh) -> dict[str, int]:
    """`mesh` as a dict of axis sizes, each a positive integer of a known axis.

    Raises:
        CpplanError: not a dict, an unknown axis, or a size that is not a positive integer.
    """
    if not isinstance(mesh, dict):
        raise CpplanError(f"mesh={mesh!r} must be a dict of axis sizes, e.g. {{'context': 16}}.")
    for axis, size in mesh.items():
        if axis not in AXES:
            raise CpplanError(f"mesh axis {axis!r} is not one of {AXES}.")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise CpplanError(f"mesh[{axis!r}]={size!r} must be a positive integer.")
    return dict(mesh)


MAX_TOKENS = 2**40  # a trillion tokens: beyond any memory a step could hold, and what max_seq_len probes to


def parse_seq_len(value: "int | str", *, what: str = "sequence length") -> int:
    """Tokens from an int or a string like ``4M``, ``128k``, ``131072`` (k/M are powers of 1024).

    Args:
        value: the token count.
        what: what the count is, as error messages name it (the batch's tokens are read here too).
    Raises:
        CpplanError: unparsable, not positive, or over `MAX_TOKENS`.
    """
    if isinstance(value, bool):
        raise CpplanError(f"{what} {value!r} is not a number of tokens.")
    if isinstance(value, int):
        tokens = value
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*", str(value))
        if not m:
            raise CpplanError(
                f"cannot read {what} {value!r}: write tokens as 131072, 128k, 1M or 4M (k = 1024, M = 1024²)."
            )
        tokens = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
        if tokens != int(tokens):
            raise CpplanError(f"{what} {value!r} is {tokens} tokens, not a whole number.")
        tokens = int(tokens)
    if tokens < 1:
        raise CpplanError(f"{what} {value!r} must be at least 1 token.")
    if tokens > MAX_TOKENS:
        raise CpplanError(f"{what} {value!r} is {tokens} tokens, over 2**40 (1T), more than any step could hold.")
    return tokens


DOC_LENGTHS_FORMS = (
    "a fixed length (8k: documents aligned at its multiples), lognormal:MEAN:SIGMA (e.g. lognormal:8k:1, "
    "lengths lognormal with mean MEAN tokens and log-length standard deviation SIGMA), or @FILE (a "
    "histogram: " + HISTOGRAM_FORMAT + ")"
)


def parse_doc_lengths(value: "int | str | DocumentLengths") -> "int | DocumentLengths":
    """Packed documents' lengths from their text (`DOC_LENGTHS_FORMS`): a fixed length as an int, a
    lognormal or a histogram file as `DocumentLengths`; an int or `DocumentLengths` passes through.

    Raises:
        CpplanError: a form not listed, a bad length, sigma or file.
    """
    if isinstance(value, DocumentLengths) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    text = str(value).strip()
    if text.startswith("@"):
        return read_histogram(text[1:])
    kind, _, rest = text.partition(":")
    if kind.strip().lower() == DocumentsKind.LOGNORMAL.value:
        mean, _, sigma = rest.partition(":")
        try:
            spread = float(sigma)
        except ValueError:
            raise CpplanError(
                f"--doc-lengths {text!r}: write lognormal:MEAN:SIGMA, e.g. lognormal:8k:1 (SIGMA a number)."
            ) from None
        return lognormal(parse_seq_len(mean, what=f"--doc-lengths {text!r}: the mean"), spread)
    if ":" in text:
        raise CpplanError(f"--doc-lengths {text!r} is not one of the forms: {DOC_LENGTHS_FORMS}.")
    return parse_seq_len(text, what="--doc-lengths")


def format_tokens(tokens: int) -> str:
    """131072 → '128K', 4194304 → '4M', 1000 → '1000'."""
    for suffix, size in (("M", 1024**2), ("K", 1024)):
        if tokens >= size and tokens % size == 0:
            return f"{tokens // size}{suffix}"
    return str(tokens)


def _enum_set(kind, values, default=None) -> frozenset:
    if values is None:
        return frozenset(kind if default is None else default)
    if isinstance(values, (str, kind)):
        values = [values]
    if not isinstance(values, (list, tuple, set, frozenset)):
        raise CpplanError(f"{values!r} is not a list of {kind.__name__} names; give a name or a list of them.")
    return frozenset(kind.parse(v) for v in values)


@dataclass(frozen=True)
class SearchOptions:
    """What the search may vary and what it holds fixed.

    Attributes:
        global_batch_tokens: the tokens per step aimed for; the search takes the number of
            sequences nearest it that some plan fits. Default max(seq_len, 4M), Llama 3's initial
            batch, on accelerators, and one sequence on a CPU host (`cpu:N` is for trying plans,
            not for training at scale).
        global_batch: an exact number of sequences per step instead of a target.
        strategies: context-parallel strategies allowed (enum members or MaxText names).
        mesh: axis sizes held fixed, e.g. ``{"context": 16}``; the rest are searched.
        remat: remat policies allowed; by default `cost_models.remat.SEARCHED_POLICIES`. `custom`
            is searched as `cost_models.remat.SEARCHED_CUSTOM` places it (other placements: give a plan).
        load_balance: balancing choices allowed.
        loss_chunk_tokens: cross-entropy chunk; 0 = full logits (MaxText's default).
        param_dtype / compute_dtype / mu_dtype: priced dtypes of the weights (their gradients and
            AdamW's second moment), the activations, and AdamW's first moment.
        quantization: the matmuls' precision (`none`: bf16; `fp8_full`: fp8 on a chip with an fp8 peak).
    """

    global_batch_tokens: int | None = None
    global_batch: int | None = None
    strategies: frozenset = frozenset(CPStrategy)
    mesh: tuple[tuple[str, int], ...] = ()
    remat: frozenset = frozenset(SEARCHED_POLICIES)
    load_balance: frozenset = frozenset(LoadBalance)
    loss_chunk_tokens: int = DEFAULT_LOSS_CHUNK_TOKENS
    param_dtype: str = "float32"
    compute_dtype: str = "bfloat16"
    mu_dtype: str = "float32"
    quantization: Quantization = Quantization.NONE

    @classmethod
    def build(
        cls,
        *,
        global_batch_tokens=None,
        global_batch=None,
        strategies=None,
        mesh=None,
        remat=None,
        load_balance=None,
        loss_chunk_tokens=DEFAULT_LOSS_CHUNK_TOKENS,
        param_dtype="float32",
        compute_dtype="bfloat16",
        mu_dtype="float32",
        quantization=Quantization.NONE,
        **unknown,
    ) -> "SearchOptions":
        """Validated options from keyword arguments (names as the attributes).

        Raises:
            CpplanError: an unknown option, or a value outside what the option accepts.
        """
        if unknown:
            known = (
                "global_batch_tokens, global_batch, strategies, mesh, remat, load_balance, loss_chunk_tokens, "
                "param_dtype, compute_dtype, mu_dtype, quantization"
            )
            raise CpplanError(f"unknown option(s) {', '.join(sorted(unknown))}; the options are {known}.")
        fixed = check_mesh(mesh or {})
        for name, dtype in (("param_dtype", param_dtype), ("compute_dtype", compute_dtype), ("mu_dtype", mu_dtype)):
            if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
                raise CpplanError(f"{name}={dtype!r} is not one of {sorted(DTYPE_BYTES)}.")
        if global_batch_tokens is not None:
            global_batch_tokens = parse_seq_len(global_batch_tokens, what="global_batch_tokens")
        if global_batch is not None:
            if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
                raise CpplanError(f"global_batch={global_batch!r} must be a positive number of sequences.")
            if global_batch_tokens is not None:
                raise CpplanError(
                    f"global_batch={global_batch} (exact sequences) and global_batch_tokens="
                    f"{global_batch_tokens} (a target) both set the batch; give one of them."
                )
        if isinstance(loss_chunk_tokens, str) and loss_chunk_tokens.strip() != "0":
            loss_chunk_tokens = parse_seq_len(loss_chunk_tokens, what="loss_chunk_tokens")
        elif isinstance(loss_chunk_tokens, str):
            loss_chunk_tokens = 0
        if isinstance(loss_chunk_tokens, bool) or not isinstance(loss_chunk_tokens, int) or loss_chunk_tokens < 0:
            raise CpplanError(f"loss_chunk_tokens={loss_chunk_tokens!r} must be 0 (full logits) or a positive integer.")
        sets = {
            "strategies": _enum_set(CPStrategy, strategies),
            "remat": _enum_set(RematPolicy, remat, SEARCHED_POLICIES),
            "load_balance": _enum_set(LoadBalance, load_balance),
        }
        for name, chosen in sets.items():
            if not chosen:
                raise CpplanError(f"{name}=[] allows nothing; leave it out to allow every choice.")
        return cls(
            global_batch_tokens,
            global_batch,
            sets["strategies"],
            tuple(sorted(fixed.items())),
            sets["remat"],
            sets["load_balance"],
            loss_chunk_tokens,
            param_dtype,
            compute_dtype,
            mu_dtype,
            Quantization.parse(quantization),
        )

    def target_sequences(self, seq_len: int, *, host: bool = False) -> float:
        """The sequences per step aimed for (a fraction where the target is not a whole number of them).

        Args:
            seq_len: tokens per sequence.
            host: the devices share one host (`cpu:N`), where the default is one sequence.
        Returns:
            `global_batch_tokens` / seq_len; by default max(seq_len, 4M) tokens on accelerators, one
            sequence on a host.
        """
        if self.global_batch_tokens is not None:
            return self.global_batch_tokens / seq_len
        if host:
            return 1.0
        return max(seq_len, DEFAULT_GLOBAL_BATCH_TOKENS) / seq_len

    def axes_fixed(self) -> dict[str, int]:
        return dict(self.mesh)

    def mesh_problem(self, topo: Topology, *, implied: dict[str, int] | None = None) -> str | None:
        """Why the fixed mesh axes cannot cover a topology's devices (over several slices: the axes
        other than data and fsdp within one slice), or None when they can; `implied`: axes the model holds
        to a size (a dense model's expert axis to 1), which count as fixed too."""
        num_devices, topology_name = topo.num_devices, topo.name
        fixed = self.axes_fixed()
        product = math.prod(fixed.values())
        given = " × ".join(f"{a}={s}" for a, s in fixed.items())
        if num_devices % product:
            return (
                f"mesh {given} spans {product} devices; {topology_name} has {num_devices}, which {product} does "
                f"not divide: fix axes whose product divides {num_devices}, or pick a topology with a multiple "
                f"of {product} devices."
            )
        if len(fixed.keys() | (implied or {}).keys()) == len(AXES) and product != num_devices:
            return (
                f"mesh {given} covers {product} of {topology_name}'s {num_devices} devices; every axis is fixed, "
                f"so their product must be {num_devices}."
            )
        inside = math.prod(s for a, s in fixed.items() if a not in ("data", "fsdp"))
        if topo.num_slices > 1 and topo.devices_per_slice % inside:
            return (
                f"mesh {given} puts {inside} devices on context, context_ulysses and tensor, which stay inside "
                f"one slice; a slice of {topology_name} has {topo.devices_per_slice}, which {inside} does not "
                f"divide: only data and fsdp span slices."
            )
        return None


def ordered_factorizations(n: int, parts: int, fixed: dict[int, int] | None = None) -> list[tuple[int, ...]]:
    """Every tuple of `parts` positive integers whose product is n (position i held to fixed[i])."""
    return list(_factorizations(n, parts, tuple(sorted((fixed or {}).items()))))


@lru_cache(maxsize=64)
def _factorizations(n: int, parts: int, fixed_items: tuple) -> tuple[tuple[int, ...], ...]:
    # a sweep or a max_seq_len probe asks for the same device count many times
    fixed = dict(fixed_items)
    tails: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}  # the endings of a remaining count, built once

    def ending(i: int, remaining: int) -> tuple[tuple[int, ...], ...]:
        if (i, remaining) not in tails:
            if i == parts - 1:
                found = ((remaining,),) if fixed.get(i, remaining) == remaining else ()
            else:
                choices = [fixed[i]] if i in fixed else divisors(remaining)
                found = tuple(
                    (d,) + rest for d in choices if remaining % d == 0 for rest in ending(i + 1, remaining // d)
                )
            tails[(i, remaining)] = found
        return tails[(i, remaining)]

    return ending(0, n)


def as_list(values: Iterable) -> list:
    """Enum members in a stable order."""
    return sorted(values, key=lambda v: v.value)
