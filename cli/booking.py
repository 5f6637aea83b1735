"""The book command: which slice to book for a token budget, with the best plan, days and cost on each."""

from __future__ import annotations

import argparse
import sys

from cli.args import add_command, add_html, csv_words, html_target, model_of, to_json
from cost_models.chips import known_chips
from cost_models.prices import KINDS, parse_prices
from planner.book import book


def cmd_book(args: argparse.Namespace) -> int:
    """Every slice's best plan, the days and cost of the budget on it, the Pareto front and the choice."""
    html = html_target(args)
    tpus = [name for name, chip in known_chips().items() if chip.kind.has_torus]
    prices = parse_prices(args.price, tpus) if args.price is not None else None
    options = {
        k: v
        for k, v in {
            "strategies": csv_words(args.strategies),
            "remat": csv_words(args.remat),
            "global_batch_tokens": args.global_batch_tokens,
        }.items()
        if v is not None
    }
    answer = book(
        model_of(args),
        args.seq_len,
        tokens=args.tokens,
        within=args.within,
        chips=csv_words(args.chips),
        prices=prices,
        price_kind=args.price_kind,
        **options,
    )
    print(to_json(answer.to_dict()) if args.json else answer)
    if html:
        from validation.html_report.book import draw
        from validation.html_report.page import write

        write(draw(answer.to_dict()), html)
        print(f"wrote {html}", file=sys.stderr)
    return 0 if answer.rows else 1


def register(sub) -> None:
    """Adds book to the subparsers `sub`."""
    p = add_command(sub, "book", cmd_book, "which slice to book: days and cost of a token budget on every slice")
    p.add_argument("--model", required=True, help="model name (e.g. llama3.1-8b) or path to a config.json")
    p.add_argument("--seq-len", required=True, help="tokens per sequence: 131072, 128k, 1M")
    p.add_argument("--tokens", required=True, help="the token budget to train, decimal: 100B, 1.5T, 500M")
    p.add_argument("--within", help="the deadline: a duration (14d, 2w, 36h) or a date (YYYY-MM-DD)")
    p.add_argument("--chips", help="chips to consider, e.g. v5p,tpu7x (default: every TPU chip row)")
    p.add_argument(
        "--price",
        help="dollars per chip-hour, replacing the published list prices: CHIP=DOLLARS pairs (v5p=4.20,tpu7x=6) "
        "or a file of them (a JSON object, or a pair a line)",
    )
    p.add_argument(
        "--price-kind", choices=KINDS, default="on_demand", help="which published price to use where one is given"
    )
    p.add_argument("--strategies", help="allowed strategies, as explain takes them")
    p.add_argument("--remat", help="allowed remat policies, as explain takes them")
    p.add_argument("--global-batch-tokens", help="tokens per step to aim for, as explain takes it (default 4M)")
    p.add_argument("--full-mask", action="store_true", help="plan a full (non-causal) mask, as explain does")
    add_html(p)
    p.add_argument("--json", action="store_true", help="machine-readable output: strict JSON alone")
