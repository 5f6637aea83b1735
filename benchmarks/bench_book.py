"""`cpplan book` speed, cold, beside its target.

Run: python benchmarks/bench_book.py

Times `cpplan book --model llama3.1-8b --seq-len 1M --tokens 100B --within 30d` (every TPU chip row) in a
fresh process, so the import of the planner and every placement cache is counted, as a user meets it;
then the same per chip in this process, to show where the time goes.
"""

import subprocess
import sys
import time

ARGS = ["book", "--model", "llama3.1-8b", "--seq-len", "1M", "--tokens", "100B", "--within", "30d"]
TARGET_S = 5.0


def main() -> None:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "cli", *ARGS], capture_output=True, text=True, check=True)
    cold = time.perf_counter() - start
    verdict = "ok" if cold < TARGET_S else "SLOW"
    print(f"{'query':<40} {'s':>7} {'target':>7}")
    label = "cpplan book (every chip, cold process)"
    print(f"{label:<40} {cold:>7.2f} {TARGET_S:>6.1f}s  {verdict}")
    from cost_models.chips import known_chips
    from planner.book import book, slice_ladder

    for name, chip in known_chips().items():
        if not chip.kind.has_torus:
            continue
        start = time.perf_counter()
        answer = book("llama3.1-8b", "1M", tokens="100B", within="30d", chips=[name])
        took = time.perf_counter() - start
        print(f"{'  ' + name + f' ({len(slice_ladder(chip))} slices searched)':<40} {took:>7.2f}")
        del answer
    print(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
