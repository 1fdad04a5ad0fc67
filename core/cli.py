"""The ``ragdefense`` command: ``ragdefense demo``, ``ragdefense bench {ragdefender,grada}``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _quiet_hub() -> None:
    # Everything we load is local: no hub calls, no download progress bars.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(k=args.k)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import (
        DataError,
        data_dir,
        demo_table,
        grada_table,
        ragdefender_table,
        robustrag_table,
    )

    if args.setting == "demo":
        rows, table = demo_table()
        print(table)
        return 0
    folder = data_dir(args.data)
    if folder is None:
        print(
            "no benchmark data: pass --data PATH or set RAGDEFENSE_DATA "
            f"(looked for {args.data or os.environ.get('RAGDEFENSE_DATA')!r})",
            file=sys.stderr,
        )
        return 2
    try:
        if args.setting == "ragdefender":
            rows, table = ragdefender_table(
                folder,
                datasets=args.datasets.split(","),
                ratios=[int(r) for r in args.ratios.split(",")],
                limit=args.limit,
                timing_queries=args.timing_queries,
            )
        elif args.setting == "grada":
            rows, table = grada_table(
                folder, n_poison=[int(p) for p in args.poison.split(",")], limit=args.limit
            )
        else:
            rows, table = robustrag_table(folder, limit=args.limit or 20)
    except DataError as exc:
        print(f"data error: {exc}", file=sys.stderr)
        return 2
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.setting}.md").write_text(table + "\n", encoding="utf-8")
        (out / f"{args.setting}.json").write_text(json.dumps(rows, indent=1), encoding="utf-8")
        print(f"\nwritten: {out / args.setting}.md, {out / args.setting}.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragdefense`` console script."""
    parser = argparse.ArgumentParser(prog="ragdefense", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="poisoned knowledge base, retrieval with and without defense"
    )
    demo.add_argument("-k", type=int, default=8, help="passages retrieved per question (default 8)")
    demo.set_defaults(func=_cmd_demo)

    bench = sub.add_parser("bench", help="benchmark a defense on the shared data")
    bench.add_argument(
        "setting",
        choices=["demo", "ragdefender", "grada", "robustrag"],
        help="demo: the built-in poisoned knowledge base (no data needed); "
        "ragdefender: the RAGDefender paper's setting (gold + poison at 1x-6x); "
        "grada: RealtimeQA top-10 with 0/1/3/5 poison, context of 5; "
        "robustrag: RealtimeQA top-10, 0/1 poison, packaged LLM (--limit defaults to 20)",
    )
    bench.add_argument("--data", default=None, help="data folder (default: $RAGDEFENSE_DATA)")
    bench.add_argument("--datasets", default="nq,msmarco,hotpotqa")
    bench.add_argument("--ratios", default="1,2,4,6", help="ragdefender: poison ratios")
    bench.add_argument("--poison", default="0,1,3,5", help="grada: poison passages injected")
    bench.add_argument("--limit", type=int, default=None, help="first N questions per dataset")
    bench.add_argument(
        "--timing-queries",
        type=int,
        default=20,
        help="queries per dataset timed cold (embedding included; default 20)",
    )
    bench.add_argument("--out", default=None, help="folder for the Markdown and JSON results")
    bench.set_defaults(func=_cmd_bench)

    args: Any = parser.parse_args(argv)
    _quiet_hub()
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
