"""What the XLA TPU compiler scheduled for a training step, read from its HLO text.

`read_compiled_program(text)` reads the scheduled module (`compiled.as_text()` of a deviceless
TPU compile, see `runtime.compile`; `is_scheduled=true`, so each computation's instructions are
listed in the order they run). It is jax-free: the text is all it needs.

For every collective (all-gather, reduce-scatter, all-reduce, all-to-all, collective-permute;
synchronous, or an asynchronous `-start`/`-done` pair, or an `async-start`/`async-done` pair
wrapping one, or a continuation-fusion chain (v5e's asynchronous collective fusion: a start
fusion, compute fusions each carrying a step, a done fusion); inside while-loop bodies,
conditionals, calls and fusions) it finds:

- its kind and the array it moves per device, in the terms `cost_models.collectives` prices:
  the gathered result of an all-gather, the unreduced operand of a reduce-scatter, the operand of
  an all-reduce, an all-to-all or a collective-permute (shapes from the instruction and its
  operands' definitions; tuples summed; layouts and memory spaces ignored);
- its group size (from `replica_groups`, explicit `{{0,1},{2,3}}`, the iota form `[2,2]<=[4]`,
  or the mesh form `mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`);
- how many times a step runs it: the product of the trip counts of the while loops it sits in
  (`loop_trip_counts`: the bound its condition compares the counter with, `direction=LT`, less the
  counter's constant start, over the constant its body adds: XLA peels loops by starting at 1, and
  a windowed einsum's loop steps by 2; a branch of a conditional counts once, but for the runtime's
  layer switch between a model's masks (`layer_shares`), whose branch runs in its share of the layers);
- whether it is asynchronous, and which compute is scheduled between its start and its done:
  fusions, convolutions and dots (with their FLOPs), custom-calls such as the Mosaic splash
  kernels (by name), and loops or conditionals (with the FLOPs inside them).

Each collective is attributed to one of cpplan's price categories (`CATEGORIES`), by where the
runtime made it, read from the instruction's metadata: the Python stack frames the module
records (`stack_frame_id` → file and function) and the `op_name` path jax writes.
- `context`: made inside `runtime/attention/` (the K/V all-gather and its reduce-scatter, the
  Ulysses all-to-alls, the ring's collective-permutes), or any `ppermute`.
- `embedding`: made inside `embed_lookup` (the token gathers and the all-to-all that hands each
  device its tokens' embeddings), forward or transposed.
- `fsdp_all_gather` / `fsdp_reduce_scatter`: every other all-gather (weights: the layers' and the
  output head's, by `shard_map` or by the SPMD partitioner) and reduce-scatter (their gradients),
  and the collective-permutes of a windowed einsum, which XLA makes of a projection's matmul to
  gather its weight or scatter its gradient piece by piece;
  an all-reduce over the weight-sharding axes is a weight gradient reduced whole (the SPMD
  partitioner's way with the attention projections) and counts as `fsdp_reduce_scatter` too.
- `tensor`: an all-reduce over the `tensor` axis (the tensor-parallel partial sums, and the loss's).
- `other`: the rest (scalar losses, gradients of replicated norm scales): small, priced nowhere.
- `data_all_reduce`: an all-reduce over the `data` axis.
All-reduces are told apart by the device groups they run over, given the plan's mesh
(`mesh_axes`); without it, by op_name (`psum` tensor-parallel, a transposed `dot_general` a
weight gradient).

`CompiledProgram.matmul_flops` counts the FLOPs of every convolution and dot (inside fusions
too) times its executions per step: XLA's `cost_analysis()` counts a while body once, and leaves
out Mosaic kernels, so neither gives a step's executed matmul work.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
CATEGORIES = ("fsdp_all_gather", "fsdp_reduce_scatter", "tensor", "data_all_reduce", "context", "embedding", "other")
DTYPE_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "token": 0,
}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(DTYPE_BYTES, key=len, reverse=True)) + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*")
# ops whose time is compute: what can hide a collective scheduled around it
_COMPUTE_OPS = {
    "fusion",
    "convolution",
    "dot",
    "custom-call",
    "while",
    "conditional",
    "call",
    "reduce",
    "reduce-window",
    "scatter",
    "gather",
    "sort",
    "select-and-scatter",
}


@dataclass(frozen=True)
class Instruction:
    """One HLO instruction: its name, result shape text, opcode, operand names and attributes."""

    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str
    # per operand, the tuple element it names (newer printers write `%p#1` for get-tuple-element(%p), index=1)
    elements: tuple[int | None, ...]

    def attribute(self, key: str) -> str | None:
        """The text of `key=...` up to the next top-level comma, or None."""
        return _attribute(self.attributes, key)

    def operand_shape(self, i: int, shapes: dict[str, str]) -> str:
        """The shape text of operand `i` (its tuple element's where it names one), "" where unknown."""
        shape = shapes.get(self.operands[i], "")
        return shape if self.elements[i] is None else _tuple_element(shape, self.elements[i])

    @property
    def called(self) -> tuple[str, ...]:
        """Computations this instruction calls (fusion/call/async bodies, loop, branches)."""
        names = []
        for key in ("calls", "body", "to_apply", "branch_computations", "called_computations"):
            value = self.attribute(key)
            if value and key != "to_apply":
                names += re.findall(r"%?([\w.\-]+)", value.strip("{}"))
        return tuple(names)


@dataclass(frozen=True)
class Computation:
    """A computation's instructions in scheduled order and the shape of every value it names."""

    name: str
    instructions: tuple[Instruction, ...]
    shapes: dict[str, str]

    def by_name(self, name: str) -> Instruction | None:
        return next((i for i in self.instructions if i.name == name), None)


@dataclass(frozen=True)
class Collective:
    """One collective of the step, per device.

    Attributes:
        kind: one of `KINDS`.
        name: the instruction (the `-start` of an asynchronous pair).
        computation: the computation it is scheduled in.
        array_bytes: the array the cost model prices it by (see the module docstring).
        group_size: devices in each of its groups (2 for a collective-permute).
        executions: times a step runs it (product of enclosing loops' trip counts; inside a branch of
            the layer switch, times the share of layers that take it, so it may be fractional).
        is_async: scheduled as a start/done pair.
        category: its price category (`CATEGORIES`).
        op_name: jax's op_name path.
        compute_between: compute instructions scheduled between start and done (empty when sync).
        flops_between: FLOPs of the convolutions and dots among them (per execution).
        kernels_between: custom-call targets among them (e.g. splash's Mosaic kernels).
    """

    kind: str
    name: str
    computation: str
    array_bytes: float
    group_size: int
    executions: float
    is_async: bool
    category: str
    op_name: str = ""
    compute_between: tuple[str, ...] = ()
    flops_between: float = 0.0
    kernels_between: tuple[str, ...] = ()

    @property
    def overlapped(self) -> bool:
        """Asynchronous with matmul or kernel work scheduled between its start and done."""
        return self.is_async and (self.flops_between > 0 or bool(self.kernels_between))

    @property
    def step_bytes(self) -> float:
        """`array_bytes` times its executions per step."""
        return self.array_bytes * self.executions


@dataclass(frozen=True)
class CompiledProgram:
    """The collectives and the matmul FLOPs of one compiled step, per device."""

    collectives: tuple[Collective, ...]
    matmul_flops: float
    custom_calls: dict[str, float] = field(default_factory=dict)  # target → executions per step

    def step_bytes(self, *, by: str = "category") -> dict[str, float]:
        """Array bytes per step summed by `category` or by `kind`."""
        out: dict[str, float] = defaultdict(float)
        for c in self.collectives:
            out[getattr(c, by)] += c.step_bytes
        return dict(out)

    def of(self, *, kind: str | None = None, category: str | None = None) -> list[Collective]:
        """The collectives of one kind and/or category."""
        return [
            c
            for c in self.collectives
            if (kind is None or c.kind == kind) and (category is None or c.category == category)
        ]


# -- text → computations ---------------------------------------------------------------------
def _balanced(text: str, start: int, open_char: str = "(", close_char: str = ")") -> int:
    """Index just past the bracket that closes the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_char}{close_char} in HLO: {text[start : start + 80]!r}")


def _attribute(attributes: str, key: str) -> str | None:
    match = re.search(r"(?:^|[\s,])" + re.escape(key) + r"=", attributes)
    if not match:
        return None
    i, depth, start = match.end(), 0, match.end()
    while i < len(attributes):
        ch = attributes[i]
        if ch in "{([":
            depth += 1
        elif ch in "})]":
            depth -= 1
        elif ch == '"':
            i = attributes.index('"', i + 1)
        elif ch == "," and depth == 0:
            break
        i += 1
    return attributes[start:i].strip()


def _parse_instruction(line: str) -> Instruction | None:
    head = _INSTRUCTION.match(line)
    if not head:
        return None
    rest = line[head.end() :]
    if rest.startswith("("):  # a tuple shape
        end = _balanced(rest, 0)
    else:
        end = rest.index(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    paren = rest.find("(")
    if paren < 0:
        return None
    opcode = rest[:paren].strip()
    close = _balanced(rest, paren)
    named = re.findall(r"%([\w.\-]+)(?:#(\d+))?", rest[paren:close])
    operands = tuple(name for name, _ in named)
    elements = tuple(int(element) if element else None for _, element in named)
    if not operands:  # unprefixed operand names (older printers)
        operands = tuple(o.strip().split(" ")[-1] for o in rest[paren + 1 : close - 1].split(",") if o.strip())
        elements = (None,) * len(operands)
    return Instruction(head.group(2), shape, opcode, operands, rest[close:].lstrip(", "), elements)


def _tuple_element(shape: str, index: int) -> str:
    """The `index`-th top-level element of a tuple shape text ("" where it has none)."""
    shape = re.sub(r"/\*[^*]*\*/", "", shape).strip()
    if not shape.startswith("("):
        return ""
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(shape):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
            parts.append(shape[start:i].strip())
            start = i + 1
    return parts[index] if index < len(parts) else ""


def parse_computations(text: str) -> tuple[dict[str, Computation], str]:
    """Every computation of a module's text, and the entry computation's name.

    Raises:
        ValueError: the text has no ENTRY computation.
    """
    computations, entry = {}, None
    name, lines = None, []
    for line in text.splitlines():
        if name is None:
            header = _HEADER.match(line)
            if header:
                name, lines = header.group(2), []
                if header.group(1):
                    entry = name
            continue
        if re.match(r"^\}(,|\s*$)", line):  # "}" or "}, execution_thread=..." (not a metadata "}}")
            body = [i for i in map(_parse_instruction, lines) if i is not None]
            computations[name] = Computation(name, tuple(body), {i.name: i.shape for i in body})
            name = None
        elif _INSTRUCTION.match(line) or not lines:
            lines.append(line)
        else:  # an attribute printed over several lines (e.g. a kernel's metadata)
            lines[-1] += " " + line.strip()
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text: give the scheduled module of compiled.as_text()")
    return computations, entry


# -- shapes, groups, FLOPs -------------------------------------------------------------------
def shape_bytes(shape: str) -> float:
    """Bytes of every array in a shape text (a tuple's elements summed; layouts ignored)."""
    shape = re.sub(r"\{[^{}]*\}", "", shape)  # layouts and memory spaces
    return float(
        sum(
            DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
            for dtype, dims in _ARRAY.findall(shape)
        )
    )


def _arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    shape = re.sub(r"\{[^{}]*\}", "", shape)
    return [(dtype, tuple(int(d) for d in dims.split(",") if d)) for dtype, dims in _ARRAY.findall(shape)]


def group_size(instruction: Instruction) -> int:
    """Devices per group of a collective, from `replica_groups` (any of XLA's three forms)."""
    if instruction.opcode.startswith("collective-permute"):
        return 2
    groups = instruction.attribute("replica_groups")
    if groups is None:
        return 1
    if groups.startswith("mesh["):
        sizes = dict((k, int(v)) for k, v in re.findall(r"'([^']+)'=(\d+)", groups[: groups.index("]")]))
        chosen = re.findall(r"'([^']+)'", groups[groups.index("]") :])
        return math.prod(sizes[a] for a in chosen) if chosen else math.prod(sizes.values())
    iota = re.match(r"\[([0-9,]+)\]<=", groups)
    if iota:
        return int(iota.group(1).split(",")[-1])
    first = re.search(r"\{([0-9,\s]*)\}", groups[1:])
    if not first or not first.group(1).strip():
        return 1
    return len(first.group(1).split(","))


def replica_groups(instruction: Instruction) -> frozenset[frozenset[int]] | None:
    """The device groups of a collective (logical device ids: positions in the mesh's device
    order), from any of XLA's forms; None where it has none (a collective-permute)."""
    text = instruction.attribute("replica_groups")
    if text is None:
        return None
    if text.startswith("mesh["):
        head, tail = text[: text.index("]")], text[text.index("]") :]
        axes = re.findall(r"'([^']+)'=(\d+)", head)
        chosen = re.findall(r"'([^']+)'", tail) or [a for a, _ in axes]
        ids = np.arange(math.prod(int(n) for _, n in axes)).reshape([int(n) for _, n in axes])
        order = [i for i, (a, _) in enumerate(axes) if a not in chosen] + [
            [a for a, _ in axes].index(a) for a in chosen
        ]
        size = math.prod(int(dict(axes)[a]) for a in chosen)
        rows = ids.transpose(order).reshape(-1, size)
    elif re.match(r"\[[0-9,]+\]<=", text):
        shape = [int(v) for v in re.match(r"\[([0-9,]+)\]", text).group(1).split(",")]
        dims = [int(v) for v in re.search(r"<=\[([0-9,]+)\]", text).group(1).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        perm = re.search(r"T\(([0-9,]+)\)", text)
        if perm:
            ids = ids.transpose([int(v) for v in perm.group(1).split(",")])
        rows = ids.reshape(shape[0], -1) if len(shape) > 1 else ids.reshape(1, -1)
    else:
        rows = [[int(v) for v in g.split(",") if v.strip()] for g in re.findall(r"\{([0-9,\s]*)\}", text[1:-1])]
    return frozenset(frozenset(int(v) for v in row) for row in rows)


def axis_groups(axis_sizes: dict[str, int], axes: tuple[str, ...]) -> frozenset[frozenset[int]]:
    """The device groups of a collective over `axes` of a mesh with these axis sizes (in mesh
    order): logical ids are positions in the flattened device array, as XLA numbers them."""
    names = list(axis_sizes)
    ids = np.arange(math.prod(axis_sizes.values())).reshape(list(axis_sizes.values()))
    order = [i for i, a in enumerate(names) if a not in axes] + [names.index(a) for a in names if a in axes]
    size = math.prod(axis_sizes[a] for a in names if a in axes)
    return frozenset(frozenset(int(v) for v in row) for row in ids.transpose(order).reshape(-1, size))


def _dims_of(labels: str, dims: tuple[int, ...], wanted: str) -> int:
    return math.prod(d for label, d in zip(labels, dims) if label in wanted)


def instruction_flops(instruction: Instruction, shapes: dict[str, str]) -> float:
    """FLOPs of a convolution or dot (2 per multiply-add), else 0."""
    if instruction.opcode not in ("convolution", "dot"):
        return 0.0
    out = _arrays(instruction.shape)
    if not out or len(instruction.operands) < 2:
        return 0.0
    out_elements = math.prod(out[0][1])
    rhs = _arrays(instruction.operand_shape(1, shapes))
    if instruction.opcode == "dot":
        lhs = _arrays(instruction.operand_shape(0, shapes))
        contracting = instruction.attribute("lhs_contracting_dims") or "{}"
        dims = [int(d) for d in re.findall(r"\d+", contracting)]
        return 2.0 * out_elements * math.prod(lhs[0][1][d] for d in dims) if lhs else 0.0
    labels = instruction.attribute("dim_labels")
    lhs = _arrays(instruction.operand_shape(0, shapes))
    if not labels or not rhs or not lhs:
        return 0.0
    inputs, out_labels = labels.split("->")
    lhs_labels, rhs_labels = inputs.split("_")
    out_dims = out[0][1]
    # a matmul written as a convolution may pad a window over a spatial dimension: count only the
    # taps that land on the input, per output position
    window = _window(instruction.attribute("window") or "")
    taps = 1
    for n, digit in enumerate(sorted(d for d in lhs_labels if d.isdigit())):
        size, stride, (low, _), lhs_dilate, rhs_dilate = (
            w[n] if n < len(w) else d for w, d in zip(window, (1, 1, (0, 0), 1, 1))
        )
        length = lhs[0][1][lhs_labels.index(digit)]
        positions = out_dims[out_labels.index(digit)]
        taps *= sum(
            1
            for o in range(positions)
            for k in range(size)
            if (p := o * stride + k * rhs_dilate - low) >= 0 and p % lhs_dilate == 0 and p // lhs_dilate < length
        )
    batch = _dims_of(out_labels, out_dims, "b")
    features = _dims_of(out_labels, out_dims, "f")
    return 2.0 * batch * features * _dims_of(rhs_labels, rhs[0][1], "i") * taps


def _window(text: str) -> list[list]:
    """[sizes, strides, pads (low, high), lhs dilations, rhs dilations] of a convolution window."""
    fields = dict(re.findall(r"(\w+)=([0-9_x\-]+)", text))

    def numbers(key):
        return [int(v) for v in fields[key].split("x")] if key in fields else []

    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else []
    return [numbers("size"), numbers("stride"), pads, numbers("lhs_dilate"), numbers("rhs_dilate")]


INSTRUCTION_LINE = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$", re.M)


def one_line_per_instruction(hlo_text: str) -> str:
    """The module text with each instruction on one line: a kernel's backend config can hold
    newlines (splash's `xprof_metadata`), which would otherwise end a computation early."""
    # a computation ends with `}`, on TPU7x's SparseCore with its thread after it (`}, execution_thread=...`)
    starts = re.compile(r"^(?:  (?:ROOT )?%|%|ENTRY |}(?:$|, execution_thread=)|HloModule|$)")
    lines: list[str] = []
    for line in hlo_text.splitlines():
        if lines and not starts.match(line):
            lines[-1] += " " + line
        else:
            lines.append(line)
    return "\n".join(lines)


def loop_trip_counts(hlo_text: str) -> dict[str, int]:
    """How often each while loop's body runs, by body name, for loops whose condition compares a
    counter (`get-tuple-element(param), index=K`, or `%param#K` as newer printers write it) with a
    constant (`direction=LT`): the constant less the K-th element of the loop's initial tuple (a
    constant, possibly through copies). Loops of any other form are left out (their bodies are then
    counted once)."""
    hlo_text = one_line_per_instruction(hlo_text)
    lines = {m.group(1): m.group(2) for m in INSTRUCTION_LINE.finditer(hlo_text)}
    bodies = {m.group(1): m.group(2) for m in re.finditer(r"^%?([\w.\-]+) \(.*\{\s*$((?:\n .*)*)", hlo_text, re.M)}

    def constant(name: str) -> int | None:
        while name in lines:
            m = re.search(r"\b(copy|constant)\(%?([\w.\-]*)(?:#\d+)?\)", lines[name])
            if m is None:
                return None
            if m.group(1) == "constant":
                return int(m.group(2))
            name = m.group(2)
        return None

    counts = {}
    for m in re.finditer(r"while\(%([\w.\-]+)\), condition=%([\w.\-]+), body=%([\w.\-]+)", hlo_text):
        init, condition, body = m.groups()
        text = bodies.get(condition, "")
        compare = re.search(r"compare\(%([\w.\-]+)(?:#(\d+))?, %([\w.\-]+)\), direction=LT", text)
        # the counter: the K-th element of the loop's tuple, as `%p#K` or through a get-tuple-element
        index = compare and (
            re.match(r"(\d+)", compare.group(2) or "")
            or re.search(r"get-tuple-element\(%[\w.\-]+\), index=(\d+)", lines.get(compare.group(1), ""))
        )
        bound = compare and constant(compare.group(3))
        operands = re.search(r"tuple\(([^)]*)\)", lines.get(init, ""))
        if not (index and bound is not None and operands):
            continue
        names = re.findall(r"%([\w.\-]+)", operands.group(1))
        start = constant(names[int(index.group(1))]) if int(index.group(1)) < len(names) else None
        step = _loop_step(bodies.get(body, ""), int(index.group(1)), lines, constant)
        if start is not None and step:
            counts[body] = -(-(bound - start) // step)
    return counts


def _loop_step(body_text: str, index: int, lines: dict[str, str], constant) -> int | None:
    """What a loop body adds to its counter (the `index`-th element of its root tuple): a
    windowed einsum's loop steps by 2 (one iteration per pair of ring steps)."""
    root = re.search(r"ROOT %[\w.\-]+ = .*? tuple\(([^)]*)\)", body_text)
    if root is None:
        return None
    names = re.findall(r"%([\w.\-]+)", root.group(1))
    name = names[index] if index < len(names) else ""
    while re.search(r"\b(copy|bitcast)\(%", lines.get(name, "")):
        name = re.search(r"\b(?:copy|bitcast)\(%([\w.\-]+)", lines[name]).group(1)
    add = re.search(r"\badd\(%([\w.\-]+)(?:#\d+)?, %([\w.\-]+)(?:#\d+)?\)", lines.get(name, ""))
    if add is None:
        return None
    steps = [constant(operand) for operand in add.groups()]
    return next((step for step in steps if step is not None), None)


# -- attribution -----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Stacks:
    files: dict[int, str]
    functions: dict[int, str]
    locations: dict[int, tuple[int, int]]  # location → (file id, function id)
    frames: dict[int, tuple[int, int]]  # frame → (location, parent)

    @classmethod
    def read(cls, text: str) -> "_Stacks":
        tables = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
        current = None
        for line in text.splitlines():
            if line in tables:
                current = tables[line]
                continue
            if current is None:
                continue
            row = re.match(r"^(\d+)\s+(.*)$", line)
            if not row:
                if line.startswith("%") or line.startswith("ENTRY"):
                    break
                current = None
                continue
            current[int(row.group(1))] = row.group(2)
        loc = {
            k: (
                int(re.search(r"file_name_id=(\d+)", v).group(1)),
                int(re.search(r"function_name_id=(\d+)", v).group(1)),
            )
            for k, v in tables["FileLocations"].items()
        }
        frames = {
            k: (
                int(re.search(r"file_location_id=(\d+)", v).group(1)),
                int(re.search(r"parent_frame_id=(\d+)", v).group(1)),
            )
            for k, v in tables["StackFrames"].items()
        }
        return cls(
            {k: v.strip('"') for k, v in tables["FileNames"].items()},
            {k: v.strip('"') for k, v in tables["FunctionNames"].items()},
            loc,
            frames,
        )

    def stack(self, frame_id: int | None) -> list[tuple[str, str]]:
        """(file, function) of every frame from `frame_id` up to the root."""
        out, seen = [], set()
        while frame_id in self.frames and frame_id not in seen:
            seen.add(frame_id)
            location, parent = self.frames[frame_id]
            file_id, function_id = self.locations.get(location, (0, 0))
            out.append((self.files.get(file_id, ""), self.functions.get(function_id, "")))
            frame_id = parent
        return out


def attribute(
    kind: str,
    *,
    op_name: str,
    stack: list[tuple[str, str]],
    dtypes: set[str],
    groups: frozenset | None = None,
    mesh_groups: dict[str, frozenset] | None = None,
    computation: str = "",
) -> str:
    """The price category of a collective (rules in the module docstring).

    Args:
        kind: one of `KINDS`.
        op_name: jax's op_name path of the instruction.
        stack: (file, function) frames where the runtime made it, innermost first.
        dtypes: element types of its operands.
        groups: its device groups (`replica_groups`).
        mesh_groups: the groups of the plan's collective families (`tensor`, `weights`, `data`;
            `axis_groups`), where known: an all-reduce over the tensor axis is tensor-parallel,
            one over the weight-sharding axes a weight gradient, one over data the data all-reduce.
        computation: the computation it is scheduled in (a windowed einsum's loop body says which
            collective its permutes stand for).
    Returns:
        One of `CATEGORIES`.
    """
    files = [f.replace("\\", "/") for f, _ in stack]
    functions = [fn for _, fn in stack]
    last = op_name.rsplit("/", 1)[-1]
    in_attention = any("runtime/attention/" in f for f in files)
    if kind == "collective-permute" and last == "dot_general" and not in_attention:
        return _windowed_einsum_category(op_name, computation)
    if in_attention or last == "ppermute" or kind == "collective-permute":
        return "context"
    if any(fn.startswith("embed_lookup") for fn in functions) or (dtypes and dtypes <= {"s32", "u32", "s64"}):
        return "embedding"
    if kind in ("all-gather", "reduce-scatter") and groups is not None and groups == (mesh_groups or {}).get("tensor"):
        return "tensor"  # sequence parallelism: activations gathered and scattered over tensor
    if kind == "all-gather":
        return "fsdp_all_gather"
    if kind == "reduce-scatter":
        return "fsdp_reduce_scatter"
    if kind == "all-reduce":
        mesh_groups = mesh_groups or {}
        if groups is not None and groups == mesh_groups.get("tensor"):
            return "tensor"
        if groups is not None and groups == mesh_groups.get("data"):
            return "data_all_reduce"
        if groups is not None and groups == mesh_groups.get("weights"):
            return "fsdp_reduce_scatter"  # activations never sum over the weight-sharding axes
        if not mesh_groups and last in ("psum", "psum_invariant"):
            return "tensor"
        if not mesh_groups and "transpose(" in op_name and last == "dot_general":
            return "fsdp_reduce_scatter"
    return "other"


# -- the reader ------------------------------------------------------------------------------
_SYNC = {k: k for k in KINDS}
_STARTS = {f"{k}-start": k for k in ("all-gather", "all-reduce", "collective-permute")}


# an asynchronous start whose called computation does the work (tpu7x runs collectives on its
# SparseCores this way: custom-call-start, custom-call-update with the operands, custom-call-done)
_WRAPPERS = ("async-start", "call-start", "custom-call-start")


# the runtime's switch between a layer's masks (`runtime.model.DecoderLayer.attention`): jax names a
# two-branch switch `cond`, a longer one `switch`; conditionals inside its branches (the ring's hop
# directions) carry longer paths
_LAYER_SWITCH_OP_NAME = re.compile(r"\battention/(cond|switch)$")


def _windowed_einsum_category(op_name: str, computation: str) -> str:
    """A collective-permute XLA made of a projection's matmul: a windowed einsum, which gathers the
    weight (`windowed_dot_general_body_ag`) or scatters its gradient (`_rs`) in a loop of permutes
    beside the matmul's pieces; outside its loop body (a peeled step), the backward's weight gradient
    scatters, and a forward or recomputed projection gathers."""
    if "windowed_dot_general_body_ag" in computation:
        return "fsdp_all_gather"
    if "windowed_dot_general_body_rs" in computation:
        return "fsdp_reduce_scatter"
    backward = "transpose(" in op_name and "rematted_computation" not in op_name
    return "fsdp_reduce_scatter" if backward else "fsdp_all_gather"


def _op_name(metadata: str) -> str:
    """The `op_name` path jax writes in an instruction's metadata ("" where there is none)."""
    return (re.search(r'op_name="([^"]*)"', metadata) or [None, ""])[1]


def _is_layer_switch(instruction: Instruction) -> bool:
    return bool(_LAYER_SWITCH_OP_NAME.search(_op_name(instruction.attribute("metadata") or "")))


def _wrapped(instruction: Instruction, computations: dict[str, Computation]):
    """(collective, its computation) that an `async-start`/`call-start` runs, or None."""
    if instruction.opcode not in _WRAPPERS:
        return None
    for name in instruction.called:
        wrapped = computations.get(name)
        for inner in wrapped.instructions if wrapped else ():
            if inner.opcode in _SYNC:
                return inner, wrapped
    return None


def _collective_kind(instruction: Instruction, computations: dict[str, Computation]) -> str | None:
    """The collective kind of a sync op, a `-start`, or an async start wrapping one; else None."""
    if instruction.opcode in _SYNC:
        return instruction.opcode
    if instruction.opcode in _STARTS:
        return _STARTS[instruction.opcode]
    wrapped = _wrapped(instruction, computations)
    return wrapped[0].opcode if wrapped else None


# XLA's TPU continuation fusion ("async collective fusion", v5e with
# --xla_tpu_enable_async_collective_fusion): a collective runs as a chain of fusions sharing its
# channel_id: one whose computation ends in an `AsyncCollectiveStart` custom-call, compute fusions
# that each carry a step of it, and one ending in `AsyncCollectiveDone`
_CHAIN_START, _CHAIN_DONE = "AsyncCollectiveStart", "AsyncCollectiveDone"


def _chain_link(instruction: Instruction, computations: dict[str, Computation]):
    """(role, collective, its computation) of a fusion in a continuation-fusion chain, role one
    of "start", "step", "done"; None for any other instruction."""
    if instruction.opcode != "fusion":
        return None
    for name in instruction.called:
        fused = computations.get(name)
        inner = next((i for i in (fused.instructions if fused else ()) if i.opcode in _SYNC), None)
        if inner is None or inner.attribute("channel_id") is None:
            continue
        targets = {
            (i.attribute("custom_call_target") or "").strip('"')
            for i in fused.instructions
            if i.opcode == "custom-call"
        }
        role = "start" if _CHAIN_START in targets else "done" if _CHAIN_DONE in targets else "step"
        if role == "step" and not name.startswith("async_collective_fusion"):
            return None  # a fusion that merely holds a collective
        return role, inner, fused
    return None


def _chain_done(
    start: Instruction, inner: Instruction, following: tuple[Instruction, ...], computations: dict[str, Computation]
) -> Instruction | None:
    """The `AsyncCollectiveDone` fusion of the chain a start begins (same channel_id)."""
    channel = inner.attribute("channel_id")
    for instruction in following:
        link = _chain_link(instruction, computations)
        if link and link[0] == "done" and link[1].attribute("channel_id") == channel:
            return instruction
    return None


def _done_of(start: Instruction, following: tuple[Instruction, ...]) -> tuple[Instruction, Instruction] | None:
    """(the last of the start and its `-update`s, the `-done`) of an asynchronous start. Data
    moves once the last update has handed over the operands: compute after it can overlap."""
    last, current = start, start.name
    for instruction in following:
        if current in instruction.operands and instruction.opcode.endswith(("-update", "-done")):
            if instruction.opcode.endswith("-done"):
                return last, instruction
            last, current = instruction, instruction.name
    return None


def read_compiled_program(
    text: str, *, mesh_axes: dict[str, int] | None = None, layer_shares: tuple[float, ...] | None = None
) -> CompiledProgram:
    """Reads the collectives and the matmul FLOPs of a scheduled HLO module.

    Args:
        text: `compiled.as_text()` of a compiled step (or an HLO dump of the scheduled module).
        mesh_axes: the plan's mesh, axis name → size in mesh order (`cost_models.vocabulary.AXES`),
            so that all-reduces are attributed by the axes they run over; without it, by op_name.
        layer_shares: the share of layers that take each branch of the layer switch (the conditional
            jax names `…attention/cond` or `…attention/switch`), in branch order (`plan_layer_shares`):
            what a branch runs counts that share of the switch's executions, and its FLOPs that share
            of the switch's; without it every branch counts whole (the FLOPs: the costliest branch's).
    Returns:
        Its `CompiledProgram`.
    Raises:
        ValueError: the text is not an HLO module with an ENTRY computation, a loop's trip count
            cannot be read, or a layer switch has another number of branches than `layer_shares`.
    """
    computations, entry = parse_computations(text)
    stacks = _Stacks.read(text)
    trips_of = loop_trip_counts(text)

    def trip_count(body: str) -> int:
        if body not in trips_of:
            raise ValueError(
                f"while body {body}: its condition is not a `counter < N` loop from a constant "
                f"start by a constant step; cannot count its trips"
            )
        return trips_of[body]

    mesh_groups = None
    if mesh_axes:
        from cost_models.vocabulary import WEIGHT_SHARDING_AXES

        mesh_groups = {
            "tensor": axis_groups(mesh_axes, ("tensor",)),
            "data": axis_groups(mesh_axes, ("data",)),
            "weights": axis_groups(mesh_axes, WEIGHT_SHARDING_AXES),
        }
    collectives: list[Collective] = []
    custom_calls: dict[str, float] = defaultdict(float)
    flops_cache: dict[str, float] = {}

    def branch_shares(instruction: Instruction) -> tuple[float, ...] | None:
        """Each branch's share of a conditional's executions, where it is the layer switch."""
        if layer_shares is None or not _is_layer_switch(instruction):
            return None
        if len(instruction.called) != len(layer_shares):
            raise ValueError(
                f"layer switch {instruction.name} has {len(instruction.called)} branches, but the plan's model "
                f"has {len(layer_shares)} layer masks (layer_shares={layer_shares}); read it with its own plan"
            )
        return layer_shares

    def computation_flops(name: str) -> float:
        """FLOPs of one run of a computation, loops inside it times their trip counts."""
        if name not in flops_cache:
            flops_cache[name] = 0.0  # guards against recursion
            comp = computations.get(name)
            flops_cache[name] = sum(_instruction_work(i, comp) for i in comp.instructions) if comp else 0.0
        return flops_cache[name]

    def _instruction_work(instruction: Instruction, comp: Computation) -> float:
        if instruction.opcode == "while":
            body = instruction.attribute("body")
            return trip_count(body.lstrip("%")) * computation_flops(body.lstrip("%"))
        if instruction.opcode == "conditional":
            branches, shares = instruction.called, branch_shares(instruction)
            if shares is not None:
                return sum(share * computation_flops(b) for b, share in zip(branches, shares))
            return max((computation_flops(b) for b in branches), default=0.0)
        if instruction.opcode in ("fusion", "call", "async-start"):
            return sum(computation_flops(c) for c in instruction.called)
        return instruction_flops(instruction, comp.shapes)

    def visit(name: str, executions: float, seen: tuple[str, ...] = ()) -> None:
        comp = computations.get(name)
        if comp is None or name in seen:
            return
        seen = seen + (name,)
        order = {i.name: n for n, i in enumerate(comp.instructions)}
        for n, instruction in enumerate(comp.instructions):
            if instruction.opcode == "custom-call":
                target = (instruction.attribute("custom_call_target") or "").strip('"')
                custom_calls[target] += executions
            if instruction.opcode == "while":
                body = instruction.attribute("body")
                visit(body.lstrip("%"), executions * trip_count(body.lstrip("%")), seen)
                continue
            link = _chain_link(instruction, computations)
            if link is not None:  # one collective per chain, at its start; its steps are compute
                if link[0] == "start":
                    done = _chain_done(instruction, link[1], comp.instructions[n + 1 :], computations)
                    collectives.append(
                        _collective(
                            instruction, link[1].opcode, comp, order, n, executions, wrapped=link[1:], chain_done=done
                        )
                    )
                continue
            if instruction.opcode in ("conditional", "call", "fusion"):
                shares = branch_shares(instruction) if instruction.opcode == "conditional" else None
                for called, share in zip(instruction.called, shares or (1.0,) * len(instruction.called)):
                    visit(called, executions * share, seen)
            kind = _collective_kind(instruction, computations)
            if kind is None:
                continue
            collectives.append(_collective(instruction, kind, comp, order, n, executions))

    def _collective(instruction, kind, comp, order, n, executions, *, wrapped=None, chain_done=None) -> Collective:
        inner, inner_comp = wrapped or _wrapped(instruction, computations) or (instruction, comp)
        is_async = instruction.opcode != kind
        if kind == "all-reduce" and comp.name.startswith("all-reduce-scatter"):
            kind = "reduce-scatter"  # XLA TPU's all-reduce-scatter fusion: a reduce-scatter on the links
        if chain_done is not None:
            pair = (instruction, chain_done)
        else:
            pair = _done_of(instruction, comp.instructions[n + 1 :]) if is_async else None
        launched, done = pair if pair else (instruction, None)
        operand_shapes = [inner.operand_shape(i, inner_comp.shapes) for i in range(len(inner.operands))]
        operand_bytes = sum(shape_bytes(s) for s in operand_shapes)
        if kind != "all-gather":
            array_bytes = operand_bytes
        elif inner is not instruction or done is None:
            array_bytes = shape_bytes(inner.shape)
        else:  # all-gather-start: its done holds the gathered array
            array_bytes = shape_bytes(done.shape)
        between = comp.instructions[order[launched.name] + 1 : order[done.name]] if done is not None else ()
        compute = [i for i in between if i.opcode in _COMPUTE_OPS]
        kernels = tuple(
            (i.attribute("custom_call_target") or "").strip('"') for i in compute if i.opcode == "custom-call"
        )
        flops = sum(_instruction_work(i, comp) for i in compute)
        metadata = inner.attribute("metadata") or instruction.attribute("metadata") or ""
        op_name = _op_name(metadata)
        frame = re.search(r"stack_frame_id=(\d+)", metadata)
        stack = stacks.stack(int(frame.group(1))) if frame else []
        dtypes = {d for s in operand_shapes for d, _ in _arrays(s)}
        return Collective(
            kind=kind,
            name=instruction.name,
            computation=comp.name,
            array_bytes=array_bytes,
            group_size=group_size(inner),
            executions=executions,
            is_async=is_async,
            category=attribute(
                kind,
                op_name=op_name,
                stack=stack,
                dtypes=dtypes,
                groups=replica_groups(inner),
                mesh_groups=mesh_groups,
                computation=comp.name,
            ),
            op_name=op_name,
            compute_between=tuple(i.name for i in compute),
            flops_between=flops,
            kernels_between=kernels,
        )

    visit(entry, 1)
    return CompiledProgram(
        collectives=tuple(collectives), matmul_flops=computation_flops(entry), custom_calls=dict(custom_calls)
    )


# -- counts against the price ----------------------------------------------------------------
COMPARED = ("fsdp_all_gather", "fsdp_reduce_scatter", "embedding", "tensor", "data_all_reduce", "context")


@dataclass(frozen=True)
class CountCheck:
    """A compiled step's matmul FLOPs and collective bytes next to what the price says, per device.

    Attributes:
        compiled_flops: matmul FLOPs of the compiled step (`CompiledProgram.matmul_flops`).
        priced_flops: what the price says a device executes (`cost_models.counts`).
        compiled_bytes: category → link bytes of the compiled collectives (`cost_models.counts.link_bytes`;
            a weight gradient all-reduced whole counts as the reduce-scatter it stands for).
        priced_bytes: category → the bytes the price charges.
        wasted_bytes: link bytes the compiled step moves beyond that: whole all-reduces of
            weight gradients, where a reduce-scatter would do.
        other_bytes: link bytes of collectives no price category covers.
    """

    compiled_flops: float
    priced_flops: float
    compiled_bytes: dict[str, float]
    priced_bytes: dict[str, float]
    wasted_bytes: float
    other_bytes: float

    @property
    def flops_error(self) -> float:
        """(priced − compiled) / compiled."""
        return (self.priced_flops - self.compiled_flops) / self.compiled_flops

    def bytes_error(self, category: str) -> float | None:
        """(priced − compiled) / compiled for one category; None where neither moves a byte,
        inf where only the price does."""
        compiled, priced = self.compiled_bytes.get(category, 0.0), self.priced_bytes.get(category, 0.0)
        if compiled == 0.0:
            return None if priced == 0.0 else math.inf
        return (priced - compiled) / compiled


def plan_mesh_axes(plan) -> dict[str, int]:
    """A plan's mesh as `read_compiled_program` takes it: axis → size in the runtime's mesh order."""
    from cost_models.vocabulary import AXES

    return {axis: plan.axis_size(axis) for axis in AXES}


def plan_layer_shares(plan) -> tuple[float, ...] | None:
    """The share of a plan's layers under each of its model's masks, in the order of the runtime's layer
    switch (`ModelSpec.layer_masks`, global first); None where every layer has one mask (no switch)."""
    masks = plan.model.layer_masks
    return tuple(count / plan.model.num_layers for _, count in masks) if len(masks) > 1 else None


def read_plan_program(text: str, plan) -> CompiledProgram:
    """`read_compiled_program` of a plan's compiled step, told the plan's mesh and layer shares."""
    return read_compiled_program(text, mesh_axes=plan_mesh_axes(plan), layer_shares=plan_layer_shares(plan))


def count_check(plan, program: CompiledProgram) -> CountCheck:
    """Compares a plan's compiled program with its price.

    Args:
        plan: the `planner.plan.Plan` compiled.
        program: `read_plan_program(text, plan)` of its scheduled step.
    Returns:
        The `CountCheck`.
    """
    from cost_models.counts import executed_matmul_flops, link_bytes, priced_link_bytes
    from planner.estimate import candidates_of

    x = candidates_of(plan)
    compiled: dict[str, float] = defaultdict(float)
    wasted = other = 0.0
    for c in program.collectives:
        charged = link_bytes(c.kind, c.array_bytes, c.group_size) * c.executions
        if c.category == "fsdp_reduce_scatter" and c.kind == "all-reduce":
            needed = link_bytes("reduce-scatter", c.array_bytes, c.group_size) * c.executions
            wasted += charged - needed
            charged = needed
        if c.category == "other":
            other += charged
        else:
            compiled[c.category] += charged
    priced = {k: float(v[0]) for k, v in priced_link_bytes(x).items()}
    return CountCheck(
        compiled_flops=program.matmul_flops,
        priced_flops=float(executed_matmul_flops(x)[0]),
        compiled_bytes=dict(compiled),
        priced_bytes=priced,
        wasted_bytes=wasted,
        other_bytes=other,
    )


# the names XLA's rematerialization gives the instructions it clones
REMAT = re.compile(r"\.remat\d*(?:\.|$)")  # the names XLA's rematerialization gives its clones


def module_matmuls(hlo_text: str) -> dict:
    """Matmul FLOPs one device executes per step in a compiled module, all and those of
    instructions XLA's rematerialization cloned (by name and shape), with how often each runs
    (`validation.compiled_program`: its FLOPs of a dot or convolution and its loop trip counts).

    Args:
        hlo_text: the compiled module's text (`compiled.as_text()`).
    Returns:
        `matmul_flops`, `remat_matmul_flops`, `remat_matmuls` (clone, shape and runs → FLOPs),
        `remat_instructions` (how many instructions the pass cloned) and `loop_trip_counts`.
    """
    hlo_text = one_line_per_instruction(hlo_text)
    computations, entry = parse_computations(hlo_text)
    trips = loop_trip_counts(hlo_text)
    runs: dict[str, int] = defaultdict(int)
    caller_name = {}  # a fusion's matmul takes the name of the instruction that calls it

    def visit(name: str, times: int) -> None:
        runs[name] += times
        for instruction in computations[name].instructions if name in computations else ():
            for callee in instruction.called:
                caller_name.setdefault(callee, instruction.name)
                visit(callee, times * (trips.get(callee, 1) if instruction.opcode == "while" else 1))

    visit(entry, 1)
    total, cloned = 0.0, defaultdict(float)
    remat_names = [i.name for c in computations.values() for i in c.instructions if REMAT.search(i.name)]
    for name, computation in computations.items():
        for instruction in computation.instructions:
            flops = instruction_flops(instruction, computation.shapes) * runs[name]
            if not flops:
                continue
            total += flops
            owner = caller_name.get(name, instruction.name)
            if REMAT.search(owner) or REMAT.search(instruction.name):
                shape = instruction.shape.split("{")[0]
                cloned[f"{owner} {shape} × {runs[name]}"] += flops
    return {
        "matmul_flops": total,
        "remat_matmul_flops": sum(cloned.values()),
        "remat_matmuls": dict(cloned),
        "remat_instructions": len(remat_names),
        "loop_trip_counts": trips,
    }
