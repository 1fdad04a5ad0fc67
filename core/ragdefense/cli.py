"""The ``ragdefense`` command: ``demo``, ``attack``, ``audit`` and ``limits`` (the benchmark
suite is the repository's ``python -m benchmarks``, not shipped)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .attacks import ATTACKS
from .cliargs import UsageError, called, require_embeddings
from .cliargs import positive as _positive
from .cliargs import resolve as _resolve
from .defenses.registry import DEFAULT_DEFENSE, names
from .embedders import EmbeddingError
from .integration.vectors import CannotCopy
from .offline import offline

if TYPE_CHECKING:
    from .redteam import AttackTarget

__all__ = ["UsageError", "build_parser", "demo_targets", "main"]


def demo_targets() -> list[AttackTarget]:
    """The demo knowledge base's questions as red-team targets, with its planted claims (their
    question prefix taken off: each attack writes its own)."""
    from .data import load_demo_kb
    from .redteam import AttackTarget

    return [
        AttackTarget(
            q.question,
            q.incorrect_answer,
            q.correct_answer,
            tuple(p.removeprefix(q.question).strip() for p in q.poison),
        )
        for q in load_demo_kb()
    ]


def _llm(spec: str | None) -> Any:
    """``--llm``: ``None``, ``"packaged"`` (kept as the name) or a resolved ``module:attr``."""
    if spec is None or spec == "packaged":
        return spec
    return _resolve(spec, "--llm (use 'packaged' or module:attribute)")


class RunFailed(RuntimeError):
    """A command that failed past its checks (a model or server down): exit code 1."""


def _out_file(path: str | None, *inputs: str | None) -> None:
    """``--json``: a writable file in an existing folder, none of the command's ``inputs``."""
    if path is None:
        return
    file = Path(os.path.realpath(path))  # a link's file (a link loop: its own path)
    if file.is_dir() or not file.parent.is_dir():
        raise UsageError(f"--json {path}: name a file in an existing folder")
    if not os.access(file.parent, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        raise UsageError(f"--json {path}: not writable (the file, nor its folder)")
    if file.exists() and any(i and Path(i).exists() and file.samefile(i) for i in inputs):
        raise UsageError(f"--json {path}: that is an input of this command; name another file")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    require_embeddings("the demo")

    run_demo(k=args.k)
    return 0


def _cmd_limits(args: argparse.Namespace) -> int:
    from .limits import limits

    rows = limits()
    width = max((len(setting) for setting, _, _ in rows), default=0)
    for setting, value, what in rows:
        print(f"{setting:<{width}}  {value!s:>6}  {what}")
    return 0


def _cmd_attack(args: argparse.Namespace) -> int:
    from .data import load_demo_kb
    from .defenses.registry import preset
    from .redteam import InMemoryKnowledgeBase, check_red_team, load_targets

    _out_file(args.json, args.targets, args.kb)
    try:
        preset(args.defense)  # a bad name fails here, before any work
    except ValueError as exc:
        raise UsageError(f"--defense: {exc}") from None
    for flag, given in (("--store", args.store), ("--targets", args.targets), ("--kb", args.kb)):
        if given is not None and not given.strip():  # never the demo's in its place
            raise UsageError(f"{flag} is empty: give it a value, or leave it out")
    if args.store and (args.kb or args.llm):
        flag = "--kb" if args.kb else "--llm"
        raise UsageError(f"{flag} is for the built-in knowledge base; --store red-teams your own")
    try:  # the targets, checked before a model loads or a knowledge base is embedded
        targets = load_targets(args.targets) if args.targets else demo_targets()
        check_red_team(targets, args.k, args.n_poison, args.defense, args.attack)
        texts = _kb_texts(args.kb) if args.kb else None  # and the passages: before --llm loads
    except (ValueError, TypeError, OSError) as exc:
        raise UsageError(str(exc)) from None
    llm = _llm(args.llm)
    if not args.store:
        require_embeddings("attack on the built-in knowledge base")
    store: Any = _resolve(args.store, "--store") if args.store else None
    try:
        options = {"defense": args.defense, "attack": args.attack, "n_poison": args.n_poison}
        if store is not None:
            from .plugins import framework_of

            store = _called(store, args.store)
            report = framework_of(store).red_team(store, targets, k=args.k, **options)
        else:
            texts = texts or [t for q in load_demo_kb() for t in q.benign]
            answer = None
            if llm is not None:
                from .llm import as_llm
                from .robustrag import ISOLATED_PROMPT

                model = as_llm(None if llm == "packaged" else llm)

                def answer(q: str, ctx: list[str]) -> str:
                    prompt = ISOLATED_PROMPT.format(context="\n\n".join(ctx), query=q)
                    made = model.generate([prompt])[0]
                    if made.text is None or not made.ok:  # no answer is no verdict either
                        raise RunFailed(f"--llm {args.llm} failed to answer: {made.error}")
                    return made.text

            report = InMemoryKnowledgeBase(texts).red_team(
                targets, k=args.k, answer=answer, **options
            )
    except CannotCopy as exc:  # its copy function is a Python argument the CLI cannot take
        print(f"error: {exc}", file=sys.stderr)
        print(f"--store cannot pass {exc.keyword}=: call red_team() from Python", file=sys.stderr)
        return 2
    except (ValueError, TypeError, ImportError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunFailed as exc:  # the run failed (a model down), not its arguments
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(report)
    if args.json:
        target = Path(os.path.realpath(args.json))  # a link's file, not the link
        # a name of its own, created here: never a user's file or a link, nor another run's
        part = target.with_name(f".{target.name}.{uuid.uuid4().hex}.part")
        try:  # whole or not at all: a file of that name is replaced only by a full report
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(json.dumps(report.to_dict(), indent=1))
            os.replace(part, target)
        except OSError as exc:
            with contextlib.suppress(OSError):  # (a folder of that name stays)
                part.unlink(missing_ok=True)
            print(f"error: --json {args.json}: {exc}", file=sys.stderr)
            return 1
    return 0


def _called(store: Any, spec: str) -> Any:
    """``--store``: the store, or what the function it names returns (its failure in a line)."""
    if not callable(store) or hasattr(store, "as_retriever"):
        return store
    return called(store, f"--store {spec}")


def _kb_texts(path: str) -> list[str]:
    """The passages of ``--kb``: a JSON list of strings, one at least that is not blank."""
    try:
        texts = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply to be a list of passages") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"--kb {path}: cannot read a JSON list of passages ({exc})") from None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"{path}: expected a JSON list of passage strings")
    if not any(t.strip() for t in texts):
        raise ValueError(f"{path}: the knowledge base holds no passage (an attack needs one)")
    return texts


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (sizes and counts are checked as they are parsed)."""
    parser = argparse.ArgumentParser(
        prog="ragdefense",
        description="Defenses for RAG against poisoned knowledge bases: a demo, a red team of "
        "your store, an audit of a whole knowledge base, and the library's limits.",
    )
    parser.add_argument("--version", action="version", version=f"ragdefense {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="poisoned knowledge base, retrieval with and without defense"
    )
    demo.add_argument(
        "-k",
        type=_positive,
        default=8,
        help="passages retrieved per question, the context half of them (default 8: the pool "
        "the default filters from, the least defend() fetches)",
    )
    demo.set_defaults(func=_cmd_demo)
    sub.add_parser("limits", help="print the limits the library holds itself to").set_defaults(
        func=_cmd_limits
    )

    attack = sub.add_parser(
        "attack",
        help="red-team a knowledge base: plant poison in a copy, compare with and without defense",
    )
    attack.add_argument(
        "--targets",
        default=None,
        help="JSON list of {question, wrong_answer, correct_answer?, poison?, alternatives?} "
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
        help="instead of the demo knowledge base, a JSON file of passage strings to red-team "
        "in memory (not with --store)",
    )
    attack.add_argument(
        "--defense",
        default=DEFAULT_DEFENSE,
        help=f"{', '.join(names())} (default {DEFAULT_DEFENSE})",
    )
    attack.add_argument(
        "--attack", default="poisonedrag", choices=list(ATTACKS), help="default poisonedrag"
    )
    attack.add_argument(
        "--n-poison",
        type=_positive,
        default=5,
        help="poison passages per question (default 5; a target's own poison texts may be "
        "fewer, and written from templates, repeat after a few distinct claims)",
    )
    attack.add_argument("-k", type=_positive, default=5, help="passages in the context (default 5)")
    attack.add_argument(
        "--llm",
        default=None,
        help="judge the answers with an LLM: 'packaged' (SmolLM2) or module:attribute (not "
        "with --store)",
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
    with contextlib.suppress(AttributeError, ValueError):  # a stream that is no text file
        # a chunk's text a console cannot show (Windows' cp1252 when redirected) is escaped
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe fails here, not at the interpreter's exit
        return code
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EmbeddingError as exc:  # a broken install or model: one line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (| head): nothing more to say
        with contextlib.suppress(OSError, ValueError):  # what is still buffered goes nowhere
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as exc:  # the output cannot be written (a full disk behind stdout): one line
        if exc.errno not in _UNWRITABLE:
            raise  # another failure (a model that cannot load) says what it is
        with contextlib.suppress(OSError, ValueError):
            print(f"error: cannot write the output: {exc}", file=sys.stderr)
        return 1


#: the errors of output that cannot be written: a full disk or quota, a file too large, I/O
_UNWRITABLE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
