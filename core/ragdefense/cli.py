"""The ``ragdefense`` command: ``demo``, ``bench ...``, ``attack`` and ``audit``."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .attacks import ATTACKS, DEFAULT_ATTACKS
from .bench.suite import DEFAULT_DEFENSES, DEFENSES
from .cliargs import UsageError
from .cliargs import counts as _counts
from .cliargs import non_negative as _non_negative
from .cliargs import positive as _positive
from .cliargs import resolve as _resolve
from .defenses.registry import DEFAULT_DEFENSE, names
from .offline import offline

__all__ = ["UsageError", "build_parser", "main"]


SETTINGS = ("suite", "demo", "ragdefender", "grada", "auto", "default", "threats", "robustrag",
            "import", "stores", "audit", "audit-scale")  # fmt: skip


def _llm(spec: str | None) -> Any:
    """``--llm``: ``None``, ``"packaged"`` (kept as the name) or a resolved ``module:attr``."""
    if spec is None or spec == "packaged":
        return spec
    return _resolve(spec, "--llm (use 'packaged' or module:attribute)")


def _out_folder(path: str | None) -> None:
    if path is not None and Path(path).exists() and not Path(path).is_dir():
        raise UsageError(f"--out {path}: a file is there; name a folder (it is created)")


def _out_file(path: str | None) -> None:
    if path is not None and (Path(path).is_dir() or not Path(path).parent.is_dir()):
        raise UsageError(f"--json {path}: name a file in an existing folder")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(k=args.k)
    return 0


def _cmd_limits(args: argparse.Namespace) -> int:
    from .limits import limits

    for setting, value, what in limits():
        print(f"{setting:<36} {value!s:>6}  {what}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import (
        DataError,
        auto_table,
        data_dir,
        demo_table,
        grada_table,
        ragdefender_table,
        robustrag_table,
    )

    _out_folder(args.out)
    if args.setting == "demo":
        rows, table = demo_table()
        print(table)
        return 0
    if args.setting in ("import", "stores"):
        from .bench.settings.imports import import_table
        from .bench.settings.stores import stores_table

        print((import_table if args.setting == "import" else stores_table)()[1])
        return 0
    if args.setting == "suite":
        return _cmd_suite(args)
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
                datasets=(args.datasets or "nq,msmarco,hotpotqa").split(","),
                ratios=args.ratios,
                limit=args.limit,
                timing_queries=args.timing_queries,
            )
        elif args.setting == "auto":
            rows, table = auto_table(
                folder,
                datasets=(args.datasets or "nq,msmarco,hotpotqa").split(","),
                ratios=args.ratios,
                n_poison=args.poison or [0, 1, 3, 5],
                limit=args.limit,
            )
        elif args.setting == "grada":
            rows, table = grada_table(
                folder, n_poison=args.poison or [0, 1, 3, 5], limit=args.limit
            )
        elif args.setting == "default":
            from .bench.settings.default import default_table

            rows, table = default_table(folder, args.candidate, limit=args.limit)
        elif args.setting == "threats":
            from .bench.settings.threats import threats_table

            rows, table = threats_table(folder, limit=args.limit)
        elif args.setting.startswith("audit"):
            from .bench.settings.audit import audit_table

            rows, table = audit_table(folder, args.setting == "audit-scale", args.out)
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


def _split(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _cmd_suite(args: argparse.Namespace) -> int:
    from .bench.datasets import DataError, data_dir
    from .bench.suite import run_suite

    folder = data_dir(args.data)
    if args.data is not None and folder is None:  # named, and not there: never just the demo
        raise UsageError(f"no data folder {args.data!r}: give the benchmark data's folder")
    defenses = _split(args.defenses) or list(DEFAULT_DEFENSES)
    llm = _llm(args.llm)
    if "robustrag" in defenses and llm is None:
        raise UsageError("the robustrag defense answers with an LLM: add --llm packaged")
    try:
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
        )
    except (DataError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.markdown)
    if args.out:
        written = result.write(args.out)
        print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:
    from .data import load_demo_kb
    from .defenses.registry import preset
    from .redteam import AttackTarget, InMemoryKnowledgeBase, load_targets

    _out_file(args.json)
    try:
        preset(args.defense)  # a bad name fails here, before any work
    except ValueError as exc:
        raise UsageError(f"--defense: {exc}") from None
    llm = _llm(args.llm)
    store: Any = _resolve(args.store, "--store") if args.store else None
    try:
        if args.targets:
            targets = load_targets(args.targets)
        else:
            targets = [
                AttackTarget(q.question, q.incorrect_answer, q.correct_answer, tuple(q.poison))
                for q in load_demo_kb()
            ]
        options = {"defense": args.defense, "attack": args.attack, "n_poison": args.n_poison}
        if store is not None:
            store = store() if callable(store) and not hasattr(store, "as_retriever") else store
            kind = type(store).__module__.split(".")[0]
            if kind == "llama_index":
                from llama_index.postprocessor.ragdefense import red_team as li_red_team

                report = li_red_team(store, targets, k=args.k, **options)
            elif kind.startswith("langchain"):
                from langchain_ragdefense import red_team as lc_red_team

                report = lc_red_team(store, targets, k=args.k, **options)
            else:
                raise ValueError(
                    f"{args.store} is neither a LangChain store nor a LlamaIndex index"
                )
        else:
            texts = (
                json.loads(Path(args.kb).read_text(encoding="utf-8"))
                if args.kb
                else [t for q in load_demo_kb() for t in q.benign]
            )
            if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise ValueError(f"{args.kb}: expected a JSON list of passage strings")
            answer = None
            if llm is not None:
                from .llm import as_llm
                from .robustrag import ISOLATED_PROMPT

                model = as_llm(None if llm == "packaged" else llm)

                def answer(q: str, ctx: list[str]) -> str:
                    prompt = ISOLATED_PROMPT.format(context="\n\n".join(ctx), query=q)
                    return model.generate([prompt])[0].text or ""

            report = InMemoryKnowledgeBase(texts).red_team(
                targets, k=args.k, answer=answer, **options
            )
    except (ValueError, TypeError, ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1), encoding="utf-8")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (sizes and counts are checked as they are parsed)."""
    parser = argparse.ArgumentParser(prog="ragdefense", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="poisoned knowledge base, retrieval with and without defense"
    )
    demo.add_argument(
        "-k", type=_positive, default=8, help="passages retrieved per question (default 8)"
    )
    demo.set_defaults(func=_cmd_demo)
    sub.add_parser("limits", help="print the limits the library holds itself to").set_defaults(
        func=_cmd_limits
    )

    bench = sub.add_parser("bench", help="benchmark a defense on the shared data")
    bench.add_argument(
        "setting",
        choices=SETTINGS,
        help="suite: every defense side by side over datasets x attacks x poison counts "
        "(see --datasets --attacks --poison --defenses --llm); "
        "demo: the built-in poisoned knowledge base (no data needed); "
        "ragdefender: the RAGDefender paper's setting (gold + poison at 1x-6x); "
        "grada: RealtimeQA top-10 with 0/1/3/5 poison, context of 5; "
        "auto: AutoDefense in both of those settings, with the ablation of its signals; "
        "default: the targets of a default defense (--candidate) in both settings, nine attack "
        "families, beside RAGDefender, GRADA and AutoDefense; "
        "threats: the default, with sources, with trusted sources, and strict, against clean "
        "retrieval, minority poison and a poisoned majority with and without provenance; "
        "robustrag: RealtimeQA top-10, 0/1 poison, packaged LLM (--limit defaults to 20); "
        "import: time of importing the core and the adapters; "
        "stores: latency the one-line defense adds per vector store; audit / audit-scale: "
        "quality / speed of `ragdefense audit` on the shared data with planted poison",
    )
    bench.add_argument("--data", default=None, help="data folder (default: $RAGDEFENSE_DATA)")
    bench.add_argument(
        "--datasets",
        default=None,
        help="ragdefender, auto: bundles (default nq,msmarco,hotpotqa); suite: demo, realtimeqa, "
        "ragdefender/<name>, poisonedrag/<name> (default: every one found in --data)",
    )
    bench.add_argument(
        "--ratios", type=_counts, default=[1, 2, 4, 6], help="ragdefender, auto: poison ratios"
    )
    bench.add_argument(
        "--poison",
        type=_counts,
        default=None,
        help="poison passages injected per question (grada, auto default 0,1,3,5; suite 1,3,5)",
    )
    bench.add_argument(
        "--attacks",
        default=None,
        help="suite: poisonedrag,injection,multi-answer (the default) and the variants "
        "no-prefix,synonym,paraphrase",
    )
    bench.add_argument(
        "--defenses",
        default=None,
        help=f"suite: {','.join(DEFAULT_DEFENSES)} (default), "
        f"{', '.join(d for d in DEFENSES if d not in DEFAULT_DEFENSES)}, robustrag (with --llm), "
        "or module:function for your own",
    )
    bench.add_argument(
        "--llm", default=None, help="suite: 'packaged' (SmolLM2) for answer accuracy and ASR"
    )
    bench.add_argument("--seed", type=int, default=0, help="suite: seed of the multi-answer attack")
    bench.add_argument(
        "--candidate",
        default=DEFAULT_DEFENSE,
        help=f"default: the defense judged ({DEFAULT_DEFENSE})",
    )
    bench.add_argument(
        "--jobs", type=_positive, default=1, help="suite: worker processes (default 1)"
    )
    bench.add_argument(
        "-m", type=_positive, default=10, help="suite: passages retrieved (default 10)"
    )
    bench.add_argument(
        "-n", type=_positive, default=5, help="suite: passages in the context (default 5)"
    )
    bench.add_argument(
        "--limit", type=_positive, default=None, help="first N questions per dataset"
    )
    bench.add_argument(
        "--timing-queries",
        type=_non_negative,
        default=20,
        help="queries per dataset timed cold (embedding included; default 20)",
    )
    bench.add_argument("--out", default=None, help="folder for the Markdown and JSON results")
    bench.set_defaults(func=_cmd_bench)

    attack = sub.add_parser(
        "attack",
        help="red-team a knowledge base: plant poison in a copy, compare with and without defense",
    )
    attack.add_argument(
        "--targets",
        default=None,
        help="JSON list of {question, wrong_answer, correct_answer?, poison?} "
        "(default: the demo questions)",
    )
    attack.add_argument(
        "--store",
        default=None,
        help="module:attribute of your LangChain vector store or LlamaIndex index (or a function "
        "returning one); default: the built-in in-memory knowledge base",
    )
    attack.add_argument(
        "--kb",
        default=None,
        help="built-in knowledge base: a JSON list of passages (default: demo)",
    )
    attack.add_argument(
        "--defense",
        default=DEFAULT_DEFENSE,
        help=f"{', '.join(names())} (default {DEFAULT_DEFENSE})",
    )
    attack.add_argument("--attack", default="poisonedrag", choices=list(ATTACKS))
    attack.add_argument(
        "--n-poison", type=_positive, default=5, help="poison passages per question"
    )
    attack.add_argument("-k", type=_positive, default=5, help="passages in the context (default 5)")
    attack.add_argument(
        "--llm", default=None, help="built-in knowledge base: 'packaged' to judge the answers"
    )
    attack.add_argument("--json", default=None, help="write the report as JSON here")
    attack.set_defaults(func=_cmd_attack)
    from .auditing.cli import add_audit_parser

    add_audit_parser(sub)

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ragdefense`` console script."""
    args: Any = build_parser().parse_args(argv)
    offline()
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
