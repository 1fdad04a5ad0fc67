"""``python -m benchmarks <setting>``: the commands that reproduce the README's tables from the
shared data (one subcommand, and one handler, per setting). Run from the repository root."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ragdefense.attacks import DEFAULT_ATTACKS
from ragdefense.cliargs import UsageError, counts, non_negative, positive, resolve
from ragdefense.defenses.registry import DEFAULT_DEFENSE
from ragdefense.offline import offline

from .datasets import DataError, data_dir
from .suite import DEFAULT_DEFENSES, DEFENSES

__all__ = ["build_parser", "main", "run_record"]

Table = tuple[Any, str]
BUNDLES = "nq,msmarco,hotpotqa"


def _folder(args: argparse.Namespace) -> Path:
    folder = data_dir(args.data)
    if folder is None:
        looked = args.data or os.environ.get("RAGDEFENSE_DATA")
        raise UsageError(f"no benchmark data: pass --data PATH or set RAGDEFENSE_DATA ({looked!r})")
    return folder


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _demo(args: argparse.Namespace) -> Table:
    from .settings.demo import demo_table

    return demo_table()


def _import(args: argparse.Namespace) -> Table:
    from .settings.imports import import_table

    return import_table()


def _latency(args: argparse.Namespace) -> Table:
    from .settings.latency import latency_table

    return latency_table()


def _stores(args: argparse.Namespace) -> Table:
    from .settings.stores import stores_table

    return stores_table()


def _ragdefender(args: argparse.Namespace) -> Table:
    from .settings.ragdefender import ragdefender_table

    return ragdefender_table(
        _folder(args),
        datasets=(args.datasets or BUNDLES).split(","),
        ratios=args.ratios,
        limit=args.limit,
        timing_queries=args.timing_queries,
        embedder=args.embedder,
    )


def _auto(args: argparse.Namespace) -> Table:
    from .settings.auto import auto_table

    return auto_table(
        _folder(args),
        datasets=(args.datasets or BUNDLES).split(","),
        ratios=args.ratios,
        n_poison=args.poison or [0, 1, 3, 5],
        limit=args.limit,
        embedder=args.embedder,
    )


def _grada(args: argparse.Namespace) -> Table:
    from .settings.grada import grada_table

    return grada_table(
        _folder(args),
        n_poison=args.poison or [0, 1, 3, 5],
        limit=args.limit,
        embedder=args.embedder,
    )


def _default(args: argparse.Namespace) -> Table:
    from .settings.default import default_table

    return default_table(_folder(args), args.candidate, limit=args.limit, embedder=args.embedder)


def _threats(args: argparse.Namespace) -> Table:
    from .settings.threats import threats_table

    return threats_table(_folder(args), limit=args.limit, embedder=args.embedder)


def _e2e(args: argparse.Namespace) -> Table:
    from .settings.e2e import e2e_table

    return e2e_table(
        _folder(args), limit=args.limit, embedder=args.embedder, cache=args.embed_cache
    )


def _quarantine(args: argparse.Namespace) -> Table:
    from .settings.quarantine import quarantine_table

    return quarantine_table(_folder(args), n_targets=args.limit or 40, embedder=args.embedder)


def _robustrag(args: argparse.Namespace) -> Table:
    from .settings.robustrag import robustrag_table

    return robustrag_table(_folder(args), limit=args.limit or 20, embedder=args.embedder)


def _audit(args: argparse.Namespace) -> Table:
    from .settings.audit import audit_table

    return audit_table(_folder(args))


def _audit_scale(args: argparse.Namespace) -> Table:
    import tempfile

    from .settings.audit_scale import ENGINES, audit_scale

    kept: list[dict[str, Any]] = []
    last = Path(args.out or "") / "audit-scale.json"
    if args.keep and args.out and last.is_file():  # rows of an earlier run, dated
        record = json.loads(last.read_text(encoding="utf-8"))
        when = record.get("date", "")
        kept = [{"date": when, **row, "kept": True} for row in record.get("rows", [])]
    engines = _split(args.engines) or list(ENGINES)
    with tempfile.TemporaryDirectory(prefix="ragdefense-bench-scale-") as tmp:
        table, rows = audit_scale(tmp, sizes=args.sizes, engines=engines, kept=kept)
    return rows, table


def _suite(args: argparse.Namespace) -> Table:
    from .suite import run_suite

    folder = data_dir(args.data)
    if args.data is not None and folder is None:  # named, and not there: never just the demo
        raise UsageError(f"no data folder {args.data!r}: give the benchmark data's folder")
    defenses = _split(args.defenses) or list(DEFAULT_DEFENSES)
    llm = args.llm
    if llm not in (None, "packaged"):
        llm = resolve(llm, "--llm (use 'packaged' or module:attribute)")
    if "robustrag" in defenses and llm is None:
        raise UsageError("the robustrag defense answers with an LLM: add --llm packaged")
    result = run_suite(
        folder,
        datasets=_split(args.datasets),
        attacks=_split(args.attacks) or DEFAULT_ATTACKS,
        counts=args.poison or [1, 3, 5],
        defenses=defenses,
        limit=args.limit,
        m=args.m,
        n=args.n,
        seed=args.seed,
        jobs=args.jobs,
        llm=llm,
        embedder=args.embedder,
    )
    if args.out:
        written = result.write(args.out)
        print("written: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return result.rows, result.markdown


def _common() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--limit", type=positive, default=None, help="first N questions each")
    common.add_argument("--out", default=None, help="folder for the Markdown and JSON results")
    common.add_argument(
        "--embed-cache",
        default=os.environ.get("RAGDEFENSE_BENCH_CACHE"),
        help="folder keeping the MiniLM vectors (and e2e's LLM answers) across runs "
        "(default: $RAGDEFENSE_BENCH_CACHE)",
    )
    return common


SETTINGS: dict[str, tuple[Callable[[argparse.Namespace], Table], str]] = {
    "suite": (_suite, "every defense side by side over datasets x attacks x poison counts"),
    "demo": (_demo, "the built-in poisoned knowledge base (no data needed)"),
    "ragdefender": (_ragdefender, "the RAGDefender paper's setting (gold + poison at 1x-6x)"),
    "grada": (_grada, "RealtimeQA top-10 with 0/1/3/5 poison, context of 5"),
    "auto": (_auto, "AutoDefense in both of those settings, with the ablation of its signals"),
    "default": (_default, "the targets of a default defense (--candidate), nine families"),
    "threats": (_threats, "the 'Choose your threat model' table"),
    "e2e": (_e2e, "the default end to end with the packaged SmolLM2 (RealtimeQA, NQ)"),
    "quarantine": (_quarantine, "a poisoned-majority knowledge base, audited, then queried"),
    "robustrag": (_robustrag, "RealtimeQA top-10, 0/1 poison, packaged LLM (--limit 20)"),
    "import": (_import, "time of importing the core and the adapters"),
    "latency": (_latency, "defense time against pool size (synthetic pools, no data)"),
    "stores": (_stores, "latency the one-line defense adds per vector store"),
    "audit": (_audit, "quality of `ragdefense audit` on the shared data with planted poison"),
    "audit-scale": (_audit_scale, "`ragdefense audit` from 100k to 1M chunks (synthetic, no data)"),
}


#: the settings that read no benchmark data (no ``--data``: it would be taken as read)
NO_DATA = frozenset({"demo", "import", "latency", "stores", "audit-scale"})


def build_parser() -> argparse.ArgumentParser:
    """One subcommand per setting, each with the options it reads."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="setting", required=True)
    common, data = _common(), argparse.ArgumentParser(add_help=False)
    data.add_argument("--data", default=None, help="data folder (default: $RAGDEFENSE_DATA)")
    made = {
        name: sub.add_parser(
            name, parents=[common] if name in NO_DATA else [common, data], help=text
        )
        for name, (_, text) in SETTINGS.items()
    }
    for name in ("ragdefender", "auto"):
        made[name].add_argument("--datasets", default=None, help=f"bundles (default {BUNDLES})")
        made[name].add_argument("--ratios", type=counts, default=[1, 2, 4, 6], help="ratios")
    made["ragdefender"].add_argument(
        "--timing-queries", type=non_negative, default=20, help="queries timed cold per dataset"
    )
    for name in ("auto", "grada", "suite"):
        made[name].add_argument("--poison", type=counts, default=None, help="poison per question")
    made["audit-scale"].add_argument(
        "--sizes", type=counts, default=[100_000, 300_000, 1_000_000], help="corpus sizes"
    )
    made["audit-scale"].add_argument(
        "--engines", default=None, help="local, ray, ray-routed (default: all)"
    )
    made["audit-scale"].add_argument(
        "--keep", action="store_true", help="keep --out's rows of the setups not run now"
    )
    made["default"].add_argument("--candidate", default=DEFAULT_DEFENSE, help="defense judged")
    suite = made["suite"]
    suite.add_argument("--datasets", default=None, help="demo, realtimeqa, ragdefender/<name>, ...")
    suite.add_argument("--attacks", default=None, help="default: poisonedrag,injection,...")
    suite.add_argument(
        "--defenses",
        default=None,
        help=f"{','.join(DEFAULT_DEFENSES)} (default), "
        f"{', '.join(d for d in DEFENSES if d not in DEFAULT_DEFENSES)}, robustrag (with --llm), "
        "or module:function for your own",
    )
    suite.add_argument("--llm", default=None, help="'packaged' (SmolLM2) for answer accuracy")
    suite.add_argument("--seed", type=int, default=0, help="seed of the multi-answer attack")
    suite.add_argument("--jobs", type=positive, default=1, help="worker processes (default 1)")
    suite.add_argument("-m", type=positive, default=10, help="passages retrieved (default 10)")
    suite.add_argument("-n", type=positive, default=5, help="passages in the context (default 5)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one setting: print its table, and write ``<setting>.md`` / ``.json`` to ``--out``."""
    args = build_parser().parse_args(argv)
    offline()
    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"error: --out {args.out}: a file is there; name a folder", file=sys.stderr)
        return 2
    try:  # made before the work: a run's results are never lost to a folder it cannot make
        if args.out is not None:
            Path(args.out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"error: --out {args.out}: cannot make it ({exc.strerror})", file=sys.stderr)
        return 2
    if getattr(args, "keep", False) and not args.out:
        print("error: --keep keeps --out's earlier rows: give --out", file=sys.stderr)
        return 2
    args.embedder = None
    if args.embed_cache:
        from .embedcache import DiskCachedEmbedder

        args.embedder = DiskCachedEmbedder(args.embed_cache)
    try:
        rows, table = SETTINGS[args.setting][0](args)
    except (UsageError, DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if args.embedder is not None:
            args.embedder.flush()
    table = table if args.setting == "suite" else with_errors(rows, table)  # its own column
    print(table)
    if args.out and args.setting != "suite":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{args.setting}.md").write_text(table + "\n", encoding="utf-8")
        record = {**run_record(argv), "setting": args.setting, "rows": rows, "table": table}
        (out / f"{args.setting}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        print(f"\nwritten: {out / args.setting}.md, {out / args.setting}.json")
    return 0


def with_errors(rows: Any, table: str) -> str:
    """``table`` with a line saying how many cases raised, where any did and the table does
    not say so itself: those cases are left out of their rows' means, which no cell shows."""
    counts = (
        [r.get("errors") for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
    )
    errors = sum(c for c in counts if isinstance(c, int))
    if not errors or "Errors:" in table:
        return table
    said = f"Errors: {errors} case(s) raised, left out of their rows' means (`errors` in the JSON)."
    return f"{table}\n\n{said}"


def run_record(argv: Sequence[str] | None) -> dict[str, Any]:
    """When, where and how a result was made: printed beside it in the docs."""
    words = list(sys.argv[1:] if argv is None else argv)
    keep, skip = [], False
    for word in words:  # the output and cache folders are the runner's, not the result's
        if skip:
            skip = False
        elif word in ("--out", "--embed-cache"):
            skip = True
        elif not word.startswith(("--out=", "--embed-cache=")):
            keep.append(word)
    return {
        "command": " ".join(["python -m benchmarks", *keep]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}",
    }
