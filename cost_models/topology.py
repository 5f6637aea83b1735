"""Topologies: a slice of chips on a torus (or the virtual devices of one host), parsed from names such
as `v5p-256` (slice names count TensorCores), `v5p:4x4x8`, `tpu7x-128`, `v5e:16x16`, `cpu:8`, and
`2xv5p-16` for slices joined over DCN (only data and fsdp may span them, as in MaxText's multi-slice
model). A topology knows its physical dimensions, which of them wrap, and what links a logical mesh axis
laid on them gets. Sources: docs/provenance/cost_models.md#topology.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from functools import lru_cache

from cost_models.chips import Chip, known_chips
from cost_models.errors import CpplanError, unknown_name

# Shapes smaller than a 4x4x4 cube that exist as slices (sides sorted ascending).
SMALL_3D_SHAPES = ((1, 2, 2), (2, 2, 2), (2, 2, 4), (2, 4, 4))
SHAPES_2D = ((1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16))
DIM_NAMES = ("x", "y", "z")
CORE = "core"
DCN_DIM = -1  # `Segment.dim` of an axis's span across slices (over DCN), beside a slice's physical dimensions
DCN = "dcn"
# A ceiling on slices, checked before anything else so that a name answers at once (the largest
# published multi-slice run used 199 pods).
MAX_SLICES = 256


@dataclass(frozen=True)
class PhysicalDim:
    """One physical dimension: chips along a torus axis, or devices inside one chip/host."""

    name: str
    size: int
    wraps: bool
    link_bw_bytes_per_s: float  # one-way, per link
    hop_latency_s: float


@dataclass(frozen=True)
class Segment:
    """A logical axis's share of one physical dimension: `size` positions, `stride` apart."""

    dim: int
    size: int
    stride: int


@dataclass(frozen=True)
class AxisLinks:
    """What a logical axis (or a group of axes) gets from the physical dimensions under it."""

    size: int
    collective_bw_bytes_per_s: float  # for all-gather / reduce-scatter / all-to-all
    collective_latency_s: float
    ring_bw_bytes_per_s: float  # one ppermute step to the next position, one direction
    ring_latency_s: float
    wraps: bool


@dataclass(frozen=True)
class Topology:
    """A slice (or `num_slices` equal slices over DCN): the chip row, one slice's chip grid, and
    the devices per chip. Chip and device counts are of all slices together."""

    chip: Chip
    chip_dims: tuple[int, ...]
    devices_per_chip: int
    num_slices: int = 1

    @property
    def name(self) -> str:
        """Canonical name, e.g. `v5p:4x4x8`, `2xv5p:4x4x8` for two slices, or `cpu:8` for devices without a torus."""
        if not self.chip.kind.has_torus:
            return f"{self.chip.name}:{self.devices_per_chip}"
        one = f"{self.chip.name}:{'x'.join(map(str, self.chip_dims))}"
        return one if self.num_slices == 1 else f"{self.num_slices}x{one}"

    @property
    def chips_per_slice(self) -> int:
        return math.prod(self.chip_dims)

    @property
    def devices_per_slice(self) -> int:
        return self.chips_per_slice * self.devices_per_chip

    @property
    def num_chips(self) -> int:
        return self.chips_per_slice * self.num_slices

    @property
    def num_devices(self) -> int:
        return self.num_chips * self.devices_per_chip

    @property
    def dcn_bw_per_device(self) -> float:
        """DCN bytes/s each device sends across slices: the chip row's per-chip figure, shared by its devices."""
        return self.chip.dcn_bw_bytes_per_s / self.devices_per_chip

    def across_slices(self, ici: AxisLinks, slices: int) -> AxisLinks:
        """The links of a collective group of `ici.size` devices in each of `slices` slices (`ici` itself
        for one), priced hierarchically as XLA lowers it: ICI over the whole array, then DCN over each device's
        1/`ici.size` shard, as the one bandwidth that gives that time in the one-level formulas; each collective
        waits the chip row's DCN latency across the slices beside ICI's (`Chip.dcn_latency_s`)."""
        if slices == 1:
            return ici
        n = ici.size * slices
        seconds_per_byte = (
            received_share(ici) / ici.collective_bw_bytes_per_s
            + (slices - 1) / slices / ici.size / self.dcn_bw_per_device
        )
        return AxisLinks(
            n,
            (n - 1) / n / seconds_per_byte,
            ici.collective_latency_s + self.chip.dcn_latency_s(slices),
            ici.ring_bw_bytes_per_s,
            ici.ring_latency_s,
            False,
        )

    def dcn_share(self, ici: AxisLinks, slices: int) -> float:
        """The fraction of a collective's bandwidth time (see `across_slices`) spent on DCN."""
        if slices == 1:
            return 0.0
        dcn = (slices - 1) / slices / ici.size / self.dcn_bw_per_device
        return dcn / (received_share(ici) / ici.collective_bw_bytes_per_s + dcn)

    @property
    def peak_flops_per_device(self) -> float:
        return self.chip.peak_bf16_flops_per_s / self.devices_per_chip

    @property
    def hbm_bw_per_device(self) -> float:
        return self.chip.hbm_bw_bytes_per_s / self.devices_per_chip

    @property
    def hbm_bytes_per_device(self) -> int:
        # rows give the figure for their own device count; a cpu:N host splits its memory N ways
        return self.chip.hbm_bytes_per_device * self.chip.devices_per_chip // self.devices_per_chip

    @property
    def physical_dims(self) -> tuple[PhysicalDim, ...]:
        return _physical_dims(self)

    def links(self, segments: tuple[Segment, ...]) -> AxisLinks:
        """Bandwidth and latency for a logical axis (or axes) laid on `segments`: collectives use every
        segment at once, both directions where it closes a ring, shared among `stride` rings; a ring step
        crosses the whole of a segment that does not close; a chip's devices share its ICI links; segments on
        `DCN_DIM` are priced by `across_slices`."""
        dcn_slices = math.prod(s.size for s in segments if s.dim == DCN_DIM)
        return self.across_slices(self._ici_links(tuple(s for s in segments if s.dim != DCN_DIM)), dcn_slices)

    def _ici_links(self, segments: tuple[Segment, ...]) -> AxisLinks:
        """`links` within one slice."""
        dims = self.physical_dims
        laid = tuple((dims[s.dim], s.size, s.stride) for s in _merged(segments))
        return _ici_links(laid, self.devices_per_chip, self.chip.kind.has_torus, max(d.hop_latency_s for d in dims))


@lru_cache(maxsize=1 << 14)  # a search prices the same segments on every slice that has their dimensions
def _ici_links(
    laid: tuple[tuple[PhysicalDim, int, int], ...], devices_per_chip: int, has_torus: bool, hop_latency_s: float
) -> AxisLinks:
    """`Topology.links` within one slice, over merged segments as (their dimension, size, stride), from what it
    reads of the slice: its devices per chip, whether the chip has a torus, the longest hop's latency."""
    size = math.prod(s for _, s, _ in laid)
    if size == 1:
        return AxisLinks(1, math.inf, 0.0, math.inf, 0.0, True)
    on_core = math.prod(s for dim, s, _ in laid if dim.name == CORE)
    ici_share = on_core / devices_per_chip if has_torus else 1.0
    coll_bw = 0.0
    coll_lat = 0.0
    ring_bw = math.inf
    ring_hops = 0
    wraps = len(laid) == 1
    for dim, seg_size, stride in laid:
        link_bw = dim.link_bw_bytes_per_s * (1.0 if dim.name == CORE else ici_share)
        closes = dim.wraps and seg_size * stride == dim.size
        wraps = wraps and closes
        directions = 2 if closes else 1
        coll_bw += directions * link_bw / stride
        coll_lat += (seg_size / 2 if closes else seg_size - 1) * stride * dim.hop_latency_s
        ring_bw = min(ring_bw, link_bw / stride)
        ring_hops = max(ring_hops, stride if closes else (seg_size - 1) * stride)
    return AxisLinks(size, coll_bw, coll_lat, ring_bw, ring_hops * hop_latency_s, wraps)


def received_share(links: AxisLinks) -> float:
    """(n-1)/n of a group of n devices: the share of a gathered array a device receives."""
    return (links.size - 1) / links.size


def _merged(segments: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """Segments of one dimension that are contiguous (inner stride × size = outer stride) as one."""
    out: list[Segment] = []
    for seg in sorted((s for s in segments if s.size > 1), key=lambda s: (s.dim, s.stride)):
        last = out[-1] if out else None
        if last is not None and last.dim == seg.dim and last.stride * last.size == seg.stride:
            out[-1] = Segment(seg.dim, last.size * seg.size, last.stride)
        else:
            out.append(seg)
    return tuple(out)


@lru_cache(maxsize=256)
def _physical_dims(topo: Topology) -> tuple[PhysicalDim, ...]:
    chip = topo.chip
    dims = []
    if chip.kind.has_torus:
        for name, size in zip(DIM_NAMES, topo.chip_dims):
            dims.append(
                PhysicalDim(
                    name, size, chip.wraparound.wraps(size), chip.ici_link_bw_bytes_per_s, chip.ici_hop_latency_s
                )
            )
    if topo.devices_per_chip > 1 or not dims:
        dims.append(
            PhysicalDim(
                CORE,
                topo.devices_per_chip,
                not chip.kind.has_torus and chip.wraparound.wraps(topo.devices_per_chip),
                chip.core_link_bw_bytes_per_s or chip.ici_link_bw_bytes_per_s,
                chip.ici_hop_latency_s,
            )
        )
    return tuple(dims)


def _valid_shape(chip: Chip, dims: tuple[int, ...]) -> str | None:
    """None if a slice of this shape exists, else the rule it breaks."""
    if len(dims) != chip.torus_rank:
        return f"{chip.name} is a {chip.torus_rank}D torus: give {chip.torus_rank} sides"
    if any(d < 1 for d in dims):
        return "every side must be at least 1"
    ordered = tuple(sorted(dims))
    if math.prod(dims) > chip.max_chips:
        return f"{math.prod(dims)} chips exceed the largest {chip.name} pod ({chip.max_chips} chips)"
    if chip.torus_rank == 2:
        if ordered not in SHAPES_2D:
            return f"2D slices are {', '.join('x'.join(map(str, s)) for s in SHAPES_2D)}"
        return None
    if ordered in SMALL_3D_SHAPES:
        return None
    if any(d % 4 for d in dims):
        small = ", ".join("x".join(map(str, s[1:] + s[:1])) for s in SMALL_3D_SHAPES)
        return f"beyond the small shapes ({small}) every side must be a multiple of 4"
    return None


def divisors(n: int) -> list[int]:
    """The divisors of a positive integer (a count of chips, devices or sequences), ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def shape_for_chips(chip: Chip, chips: int) -> tuple[int, ...] | None:
    """The most cubic valid slice shape of `chips` chips, sides of 1 last as TPU names write them (v5p-8
    is 2x2x1), or None when no slice has that many."""
    if chips < 1 or chips > chip.max_chips:
        return None  # checked first: a count beyond the pod never reaches the divisor walk
    best = None
    sides = divisors(chips)
    if chip.torus_rank == 2:
        candidates = [(a, chips // a) for a in sides]
    else:
        candidates = [(a, b, chips // (a * b)) for a in sides for b in sides if b >= a and (chips // a) % b == 0]
    for dims in candidates:
        if list(dims) != sorted(dims) or _valid_shape(chip, dims):
            continue
        key = tuple(sorted(dims, reverse=True))
        if best is None or key < tuple(sorted(best, reverse=True)):
            best = dims
    if best is None:
        return None
    return tuple(d for d in best if d > 1) + tuple(d for d in best if d == 1)


def slices_of(chip: Chip) -> list[Topology]:
    """Every slice shape of a chip up to its full pod, fewest chips first.

    Raises:
        CpplanError: the chip has no torus (a host's `cpu:N` is not a slice).
    """
    if not chip.kind.has_torus:
        raise CpplanError(f"{chip.name} has no torus, so it has no slices; write {chip.name}:N for N devices.")
    return [Topology(chip, dims, chip.devices_per_chip) for dims in _slice_shapes(chip)]


@lru_cache(maxsize=16)
def _slice_shapes(chip: Chip) -> tuple[tuple[int, ...], ...]:
    if chip.torus_rank == 2:
        shapes = [dims for dims in SHAPES_2D if not _valid_shape(chip, dims)]
    else:
        sides = sorted({d for shape in SMALL_3D_SHAPES for d in shape} | set(range(4, chip.max_chips + 1, 4)))
        shapes = [
            (a, b, c)
            for a in sides
            if a**3 <= chip.max_chips
            for b in sides
            if a <= b and a * b * b <= chip.max_chips
            for c in sides
            if b <= c <= chip.max_chips // (a * b) and not _valid_shape(chip, (a, b, c))
        ]
    # sides of 1 last, as TPU names write them (v5p-8 is 2x2x1)
    named = [tuple(d for d in dims if d > 1) + tuple(d for d in dims if d == 1) for dims in shapes]
    return tuple(sorted(named, key=lambda dims: (math.prod(dims), sorted(dims))))


def max_host_devices() -> int:
    """The most virtual devices `cpu:N` may have: the device count of the largest catalogued pod (they
    stand in for a slice's; the cap also keeps the mesh search over N's divisors quick)."""
    return max(c.max_chips * c.devices_per_chip for c in known_chips().values() if c.kind.has_torus)


def _example_names(chip: Chip) -> str:
    if not chip.kind.has_torus:
        return f"{chip.name}:8"
    shape = "4x4x8" if chip.torus_rank == 3 else "8x8"
    return f"{chip.name}-{chip.tensorcores_per_chip * 128}, {chip.name}:{shape}"


@lru_cache(maxsize=256)
def _parse(name: str, chip_dir_marker: tuple) -> Topology:
    text = name.strip().lower()
    slices = re.fullmatch(r"(\d+)x([a-z].*)", text)
    if slices is None:
        return _parse_slice(name, text)
    count, one = int(slices.group(1)), _parse_slice(name, slices.group(2))
    if not one.chip.kind.has_torus:
        raise CpplanError(
            f"topology {name!r}: {one.chip.name} devices are one host with no DCN between slices; "
            f"write {one.name} without the '{slices.group(1)}x' prefix."
        )
    problem = _slice_count_problem(count)
    if problem:
        raise CpplanError(f"topology {name!r}: {problem}, e.g. 2x{one.name}.")
    return dataclasses.replace(one, num_slices=count)


def _slice_count_problem(count: int) -> str | None:
    """None if `count` slices can be planned, else the rule it breaks."""
    if count < 1:
        return "the number of slices must be at least 1"
    if count > MAX_SLICES:
        return (
            f"{count} slices is more than the {MAX_SLICES} the planner searches (the largest published "
            f"multi-slice run used 199)"
        )
    return None


def _parse_slice(name: str, text: str) -> Topology:
    """One slice (or a host) from its name, lower-cased; `name` as the user wrote it, for errors."""
    chips = known_chips()
    m = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:([\dx]+))", text)
    if not m:
        examples = "; ".join(_example_names(c) for c in chips.values())
        raise CpplanError(
            f"cannot parse topology {name!r}: use CHIP-CORES or CHIP:AxBxC, e.g. {examples}; "
            f"NxNAME for N slices over DCN, e.g. 2xv5p-16."
        )
    chip_name, cores, shape = m.groups()
    if chip_name not in chips:
        raise unknown_name("chip", chip_name, chips)
    chip = chips[chip_name]
    if not chip.kind.has_torus:
        count = int(cores or shape) if (cores or (shape and shape.isdigit())) else 0
        if count < 1:
            raise CpplanError(f"topology {name!r}: write {chip.name}:N with N >= 1 devices, e.g. {chip.name}:8.")
        ceiling = max_host_devices()
        if count > ceiling:
            raise CpplanError(
                f"topology {name!r}: {count} virtual devices is more than any catalogued pod has "
                f"({ceiling}); {chip.name}:N stands in for a slice to try plans on, so N is at most "
                f"{ceiling}."
            )
        return Topology(chip, (1,), count)
    if shape is not None:
        try:
            dims = tuple(int(s) for s in shape.split("x"))
        except ValueError:
            raise CpplanError(f"cannot parse the shape in {name!r}: write sides like 4x4x8.") from None
        problem = _valid_shape(chip, dims)
        if problem:
            raise CpplanError(f"topology {name!r} does not exist: {problem}. Examples that do: {_example_names(chip)}.")
        return Topology(chip, dims, chip.devices_per_chip)
    count = int(cores)
    most = chip.max_chips * chip.tensorcores_per_chip
    if count > most:
        raise CpplanError(
            f"topology {name!r}: the largest {chip.name} pod has {chip.max_chips} chips "
            f"({chip.name}-{most}); ask for at most that many TensorCores."
        )
    if count % chip.tensorcores_per_chip:
        raise CpplanError(
            f"topology {name!r}: {chip.name} slice names count TensorCores, "
            f"{chip.tensorcores_per_chip} per chip; {count} is not a multiple of it."
        )
    dims = shape_for_chips(chip, count // chip.tensorcores_per_chip)
    if dims is None:
        raise CpplanError(
            f"topology {name!r}: no {chip.name} slice has {count // chip.tensorcores_per_chip} chips. "
            f"Examples that do: {_example_names(chip)}."
        )
    return Topology(chip, dims, chip.devices_per_chip)


def get_topology(name: "str | Topology", num_slices: "int | None" = None) -> Topology:
    """Parses a topology name (e.g. `v5p-256`, `2xv5p-256`, `cpu:8`; a `Topology` is returned unchanged),
    over `num_slices` slices where given (None: as the name says).

    Raises:
        CpplanError: the name does not parse, names an unknown chip, or a shape that does not exist;
            `num_slices` is not a positive integer, contradicts the name's prefix, or is given for a host.
    """
    if isinstance(name, Topology):
        topo = name
    elif isinstance(name, str):
        # the cache key includes the chip rows themselves, so a row from a new $CPPLAN_CHIP_DIR is honoured
        topo = _parse(name, tuple(sorted(known_chips().items())))
    else:
        raise CpplanError(f"topology must be a name like 'v5p-256' or 'cpu:8', got {name!r}.")
    if num_slices is not None and (isinstance(num_slices, bool) or not isinstance(num_slices, int)):
        raise CpplanError(f"num_slices={num_slices!r} must be a whole number of slices, e.g. 2.")
    if num_slices is None or num_slices == topo.num_slices:
        return topo
    problem = _slice_count_problem(num_slices)
    if problem:
        raise CpplanError(f"num_slices={num_slices}: {problem}.")
    if topo.num_slices > 1:
        raise CpplanError(
            f"topology {topo.name} already has {topo.num_slices} slices but num_slices={num_slices}; "
            f"give the count once."
        )
    if not topo.chip.kind.has_torus and num_slices > 1:
        raise CpplanError(
            f"num_slices={num_slices} on {topo.name}: a host's devices have no DCN between slices; "
            f"use a TPU slice, or num_slices=1."
        )
    return dataclasses.replace(topo, num_slices=num_slices)
