"""What fills a compiled step's HBM at its peak: the live buffers of XLA's buffer assignment,
largest first, to set against cpplan's phases (`planner.estimate(plan).hbm_bytes`).

Compile with the dump on (the TPU compiler honours XLA_FLAGS in deviceless compiles with jax
0.10.2 and libtpu 0.0.52), then read the dump:

    XLA_FLAGS="--xla_dump_to=DUMP --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_fn.*" \\
        python benchmarks/bench_memory.py --only "tpu7x all_gather4"
    python -m validation.peak_buffers DUMP               # the peak and its buffers
    python -m validation.peak_buffers DUMP --at 1291     # another point of the schedule
    python -m validation.peak_buffers DUMP --timeline 200
    python -m validation.peak_buffers MT_DUMP --module jit_train_step   # a MaxText train_compile dump

It reads the module's `*-buffer-assignment.txt` (each value's size and offset in the temporary
allocation) and `*-live-range.txt` (each value's first and last position in the schedule). Values
of one buffer share an offset (a loop's carry and its body's parameter): at each point of the
schedule a live offset counts once. The allocation can exceed the live peak (the heap's gaps);
`Heap.packed_bytes` places the same buffers, largest first, each in the tightest free room of the
offsets its live range leaves, to tell the gaps the buffers force from those the placement left.
"""

import argparse
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models.errors import CpplanError
from cost_models.units import GiB, MiB

VALUE = re.compile(r"value: <\d+ (\S+?)(\{[^}]*\})?(?: \(phi\))? @\d+> \(size=(\d+),offset=(\d+)\): (.*)")
LIVE = re.compile(r"^\s+(\S+\{[^}]*\}):(\d+)-(\d+)$", re.M)
STEP = re.compile(r"^\s+(\d+):(\S+)$", re.M)


def one_file(directory: Path, suffix: str, module: str) -> Path:
    paths = sorted(directory.glob(f"*{module}*{suffix}"))
    if len(paths) != 1:
        raise CpplanError(
            f"{directory} holds {len(paths)} files matching *{module}*{suffix}, not one; compile with "
            f"XLA_FLAGS='--xla_dump_to={directory} --xla_dump_hlo_as_text' into an empty directory, or "
            f"name the module with --module."
        )
    return paths[0]


def temp_values(assignment: str) -> tuple[int, list[tuple[str, int, int, str]]]:
    """(size, [(value, bytes, offset, shape)]) of the default memory space's temporary allocation."""
    for block in re.split(r"\nallocation ", "\n" + assignment):
        head = block.split("\n", 1)[0]
        if "preallocated-temp" in head and "color" not in head:
            size = int(re.search(r"size (\d+)", head).group(1))
            return size, [
                (m.group(1) + (m.group(2) or "{}"), int(m.group(3)), int(m.group(4)), m.group(5))
                for m in VALUE.finditer(block)
            ]
    raise CpplanError("the buffer assignment has no temporary allocation in the default memory space.")


@dataclass(frozen=True)
class Heap:
    """A compiled module's temporary allocation: its values, their live ranges and the live bytes at
    every position of the schedule."""

    size: int  # bytes of the temporary allocation: the live peak plus the heap's gaps
    values: list[tuple[str, int, int, str]]  # (value, bytes, offset, shape), those with a live range
    live: dict[str, tuple[int, int]]  # value → first and last position in the schedule
    steps: dict[int, str]  # position → instruction
    totals: np.ndarray  # live bytes at each position

    @property
    def peak(self) -> int:
        """The position of the live peak."""
        return int(self.totals.argmax())

    @property
    def live_peak_bytes(self) -> int:
        return int(self.totals.max())

    def live_at(self, t: int) -> list[tuple[str, int, int, str]]:
        """The values live at position `t`, one per offset (the largest), largest first."""
        by_offset = {}
        for value in self.values:
            start, end = self.live[value[0]]
            if start <= t <= end and value[1] > by_offset.get(value[2], (None, 0))[1]:
                by_offset[value[2]] = value
        return sorted(by_offset.values(), key=lambda v: -v[1])

    def buffers(self) -> list[tuple[int, int, int]]:
        """(first position, last position, bytes) of each buffer: the values at one offset whose live
        ranges meet are one buffer (a loop's carry and its body's parameter); apart in time, two."""
        by_offset = {}
        for name, nbytes, offset, _ in self.values:
            by_offset.setdefault(offset, []).append((*self.live[name], nbytes))
        buffers = []
        for ranges in by_offset.values():
            ranges.sort()
            start, end, nbytes = ranges[0]
            for s, e, n in ranges[1:]:
                if s > end + 1:
                    buffers.append((start, end, nbytes))
                    start, end, nbytes = s, e, n
                else:
                    end, nbytes = max(end, e), max(nbytes, n)
            buffers.append((start, end, nbytes))
        return buffers

    def packed_bytes(self) -> int:
        """The heap these buffers need when placed largest first (earliest first among equals), each at
        the smallest free room between the buffers already placed that its live range meets, or above
        them all where none is large enough."""
        placed = []  # (first, last, offset, bytes)
        top = 0
        for start, end, nbytes in sorted(self.buffers(), key=lambda b: (-b[2], b[0])):
            taken = sorted((o, o + n) for s, e, o, n in placed if s <= end and start <= e)
            room, offset, floor = None, None, 0
            for low, high in taken:
                if low - floor >= nbytes and (room is None or low - floor < room):
                    room, offset = low - floor, floor
                floor = max(floor, high)
            offset = floor if offset is None else offset
            placed.append((start, end, offset, nbytes))
            top = max(top, offset + nbytes)
        return top


def read_heap(directory: Path, module: str = "jit_fn") -> Heap:
    """The temporary allocation of the module `module` dumped into `directory`.

    Raises:
        CpplanError: the directory holds no single dump of that module, or it has no temporary allocation.
    """
    assignment = one_file(directory, "after_optimizations-buffer-assignment.txt", module).read_text()
    size, values = temp_values(assignment)
    ranges = one_file(directory, "after_optimizations-live-range.txt", module).read_text()
    live = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in LIVE.finditer(ranges)}
    steps = dict((int(i), name) for i, name in STEP.findall(ranges.split("BufferLiveRange")[0]))
    values = [v for v in values if v[0] in live]
    length = max((end for _, end in live.values()), default=0) + 1
    totals = np.zeros(length)
    by_offset = {}
    for value in values:
        by_offset.setdefault(value[2], []).append(value)
    for sharing in by_offset.values():  # an offset counts once at a position: its largest live value
        held = np.zeros(length)
        for name, nbytes, _, _ in sharing:
            start, end = live[name]
            np.maximum(held[start : end + 1], nbytes, out=held[start : end + 1])
        totals += held
    return Heap(size, values, live, steps, totals)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", type=Path, help="the --xla_dump_to directory")
    parser.add_argument("--module", default="jit_fn", help="the module's name in the dump (the train step's: jit_fn)")
    parser.add_argument("--at", type=int, help="a schedule position to list instead of the peak")
    parser.add_argument("--timeline", type=int, help="also print the live peak of every window of this many steps")
    parser.add_argument("--min-mib", type=float, default=1.0, help="list buffers of at least this many MiB")
    args = parser.parse_args()

    heap = read_heap(args.dump, args.module)
    totals, peak, steps, live = heap.totals, heap.peak, heap.steps, heap.live
    print(
        f"temporary allocation {heap.size / GiB:.3f} GiB; live peak {totals[peak] / GiB:.3f} GiB at step {peak} "
        f"({steps.get(peak)}); the heap's gaps {(heap.size - totals[peak]) / GiB:.3f} GiB; the same buffers "
        f"packed largest first {heap.packed_bytes() / GiB:.3f} GiB"
    )
    if args.timeline:
        for start in range(0, len(totals), args.timeline):
            window = totals[start : start + args.timeline]
            t = start + int(window.argmax())
            print(
                f"  steps {start:>6}-{start + len(window) - 1:<6} live peak {window.max() / GiB:.3f} GiB at {t} "
                f"({steps.get(t)})"
            )
    at = peak if args.at is None else args.at
    rows = heap.live_at(at)
    print(f"\nlive at step {at} ({steps.get(at)}): {sum(v[1] for v in rows) / GiB:.3f} GiB")
    for name, nbytes, offset, shape in rows:
        if nbytes >= args.min_mib * MiB:
            # the instruction at the end of a value's live range is its last reader: what holds it
            print(
                f"  {nbytes / MiB:9.1f} MiB  steps {live[name][0]:>6}-{live[name][1]:<6} {name:<48} "
                f"{shape[:60]:<60} until {steps.get(live[name][1])}"
            )


if __name__ == "__main__":
    main()
