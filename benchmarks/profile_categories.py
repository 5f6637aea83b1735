"""Where two profiles of the same step differ: each HLO category's device time (self time: an op's time less
that of the ops it encloses, as a while loop encloses its body's), the bytes its ops access, and how many of
the step's ops read or write a buffer in VMEM (memory space 1 in their layouts, `S(1)`), from the
`*.trace.json.gz` that `jax.profiler` writes (no TensorBoard needed).

    python benchmarks/profile_categories.py A.trace.json.gz B.trace.json.gz [LABEL_A LABEL_B]
    python benchmarks/profile_categories.py --keep TRACE.json.gz OUT.json.gz   # the device's ops alone

`--keep` writes the device op line of a trace, each op's name, times, category, bytes and HLO, without the
host's events or the source locations (the paths of the machine that ran it).

E.g. `benchmarks/results/tpu_v5e/scoped_vmem/` profiles one step compiled at the compiler's default scoped
VMEM and at the raised limit (`benchmarks/tpu_scoped_vmem_steps.py`).
"""

import collections
import gzip
import json
import sys

RATED_US = 1000  # a category's bytes per second are printed where its ops took at least this long
DEVICE_OPS = "XLA Ops"  # the device's op line in jax's trace; "Steps" and "XLA Modules" span the same time


KEPT_ARGS = ("hlo_category", "bytes_accessed", "long_name")


def device_ops(path: str) -> list[dict]:
    """The profile's device op events, in order of start (an enclosing op before the ops it encloses)."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    lines = {(e["pid"], e["tid"]) for e in events if e.get("name") == "thread_name" and e["args"]["name"] == DEVICE_OPS}
    ops = [e for e in events if e.get("ph") == "X" and (e["pid"], e["tid"]) in lines]
    return sorted(ops, key=lambda e: (e["ts"], -e["dur"]))


def keep(path: str, out: str) -> None:
    """Writes `path`'s device ops alone, with `KEPT_ARGS`, as a trace `device_ops` reads."""
    ops = device_ops(path)
    line = {"pid": ops[0]["pid"], "tid": ops[0]["tid"]} if ops else {"pid": 0, "tid": 0}
    events = [{"ph": "M", "name": "thread_name", **line, "args": {"name": DEVICE_OPS}}]
    for e in ops:
        args = {k: e["args"][k] for k in KEPT_ARGS if k in e["args"]}
        events.append({"ph": "X", **line, "ts": e["ts"], "dur": e["dur"], "name": e["name"], "args": args})
    with gzip.open(out, "wt") as f:
        json.dump({"traceEvents": events}, f)


def by_category(ops: list[dict]) -> dict[str, dict]:
    """Per HLO category: self time (µs), bytes accessed, op count."""
    self_us = [e["dur"] for e in ops]
    open_ops: list[int] = []  # the enclosing ops of the op in hand, innermost last
    for i, e in enumerate(ops):
        while open_ops and ops[open_ops[-1]]["ts"] + ops[open_ops[-1]]["dur"] <= e["ts"]:
            open_ops.pop()
        if open_ops:
            self_us[open_ops[-1]] -= e["dur"]
        open_ops.append(i)
    totals = collections.defaultdict(lambda: {"us": 0.0, "bytes": 0, "ops": 0})
    for e, us in zip(ops, self_us):
        row = totals[e["args"].get("hlo_category", "?")]
        row["us"] += us
        row["bytes"] += int(e["args"].get("bytes_accessed", 0))
        row["ops"] += 1
    return totals


def in_vmem(ops: list[dict]) -> int:
    """How many ops read or write a buffer in VMEM."""
    return sum("S(1)" in e["args"].get("long_name", "") for e in ops)


def main(a: str, b: str, label_a: str = "A", label_b: str = "B") -> None:
    ops = {label_a: device_ops(a), label_b: device_ops(b)}
    rows = {label: by_category(o) for label, o in ops.items()}
    head = f"{'HLO category':28s} {label_a + ' ms':>11s} {label_b + ' ms':>11s} {'change':>8s}"
    print(f"{head}   GB/s ({label_a}, {label_b})")
    names = set(rows[label_a]) | set(rows[label_b])
    change = {n: rows[label_b].get(n, {"us": 0})["us"] - rows[label_a].get(n, {"us": 0})["us"] for n in names}
    for name in sorted(names, key=lambda n: -abs(change[n])):
        ra, rb = (rows[label].get(name, {"us": 0.0, "bytes": 0}) for label in (label_a, label_b))
        rates = ", ".join(
            f"{r['bytes'] / r['us'] / 1e3:.0f}" if r["us"] >= RATED_US and r["bytes"] else "-" for r in (ra, rb)
        )
        print(f"{name:28s} {ra['us'] / 1e3:11.1f} {rb['us'] / 1e3:11.1f} {change[name] / 1e3:+8.1f}   {rates}")
    totals = [sum(r["us"] for r in rows[label].values()) / 1e3 for label in (label_a, label_b)]
    print(f"{'all':28s} {totals[0]:11.1f} {totals[1]:11.1f} {totals[1] - totals[0]:+8.1f}")
    print("ops with a buffer in VMEM: " + ", ".join(f"{label} {in_vmem(o)} of {len(o)}" for label, o in ops.items()))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--keep":
        keep(*sys.argv[2:])
    elif len(sys.argv) in (3, 5) and "--keep" not in sys.argv:
        main(*sys.argv[1:])
    else:
        sys.exit(__doc__)
