"""Writes the memory price's measured error per target and chip (`validation.memory_bands`) to
cost_models/data/memory_accuracy.json, and prints it.

    python regenerate/memory_bands.py
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cost_models.accuracy import MEMORY_ACCURACY_FILE  # noqa: E402
from validation.memory_bands import memory_bands  # noqa: E402


def main() -> None:
    bands = memory_bands()
    for target, chips in bands.items():
        for chip, band in chips.items():
            print(
                f"{target:8} {chip:6} compiler up to {band['under']:5.1%} over the price, price up to "
                f"{band['over']:5.1%} over the compiler, MAPE {band['mape']:5.1%}, allocated with the whole HBM "
                f"up to {band['allocated']:5.1%} over the price; {band['rows']} compiles ({band['source']})"
            )
    MEMORY_ACCURACY_FILE.write_text(json.dumps(bands, indent=2) + "\n")
    print(f"wrote {MEMORY_ACCURACY_FILE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
