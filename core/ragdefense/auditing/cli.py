"""``ragdefense audit``: the command line of :func:`ragdefense.audit`."""

from __future__ import annotations

import argparse
import html
import inspect
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..cliargs import positive, two_or_more
from .report import FORMAT_NEEDS, FORMATS

__all__ = ["add_audit_parser"]


def _formats(text: str) -> list[str]:
    found = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = sorted(set(found) - set(FORMATS))
    if not found or unknown:
        raise argparse.ArgumentTypeError(f"formats are {','.join(FORMATS)}, got {text!r}")
    return found


def _takes_nothing(obj: Any) -> bool:
    """Whether ``obj`` is a function called with no arguments (a factory, not a function from
    texts to vectors)."""
    if not callable(obj) or hasattr(obj, "embed_documents") or hasattr(obj, "encode"):
        return False
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: called with texts
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return not any(p.kind in positional and p.default is p.empty for p in params) and not any(
        p.kind is inspect.Parameter.VAR_POSITIONAL for p in params
    )


def _has(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def _check(args: argparse.Namespace) -> None:
    """Everything the audit will need, checked before any work (a missing extra or a bad name
    found after the embedding would waste it)."""
    from ..cliargs import UsageError, require_embeddings
    from ..defenses.registry import preset

    for name in args.defense or []:
        try:
            preset(name)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    model = args.embedder  # a path, not a model hub name to try (offline: a misleading error)
    local = model and ":" not in model and model.startswith(("/", "./", "../"))
    if local and not Path(model).is_dir():
        raise UsageError(f"--embedder {model!r}: no such folder (a saved model's folder)")
    if Path(args.workdir).exists() and not Path(args.workdir).is_dir():
        raise UsageError(f"--workdir {args.workdir!r} is a file: give a folder")
    if Path(args.knowledge_base).is_dir():
        raise UsageError(
            f"{args.knowledge_base!r} is a folder: give a .jsonl / .parquet file of {{id, text}}"
        )
    default = ["md", "json", "csv", *(["png"] if _has("matplotlib") else [])]
    args.format = list(dict.fromkeys(args.format or default))  # --format given twice: both
    for fmt in args.format:
        if fmt in FORMAT_NEEDS and not _has(FORMAT_NEEDS[fmt][0]):
            module, install = FORMAT_NEEDS[fmt]
            raise UsageError(f"--format {fmt} needs {module}: pip install {install}")
    if args.engine == "ray" and not _has("ray"):
        raise UsageError("--engine ray needs Ray: pip install 'ragdefense[ray]'")
    if args.engine != "ray" and (args.address or args.workers):
        raise UsageError("--address and --workers are for --engine ray")
    if args.queries is not None and args.max_probes is not None:
        raise UsageError("--max-probes samples derived probes: a query log (--queries) is whole")
    if args.queries is not None and not Path(args.queries).is_file():
        raise UsageError(f"no query log at {args.queries}")
    if args.engine == "ray":
        from .engines import _reachable

        try:  # an unreachable cluster: said now, not as a run failing
            _reachable(args.address or os.environ.get("RAY_ADDRESS"))
        except ConnectionError as exc:
            raise UsageError(str(exc)) from None
    if Path(args.knowledge_base).exists() and args.embedder is None:  # the packaged model embeds
        require_embeddings(f"auditing {args.knowledge_base}")


def _cmd_audit(args: argparse.Namespace) -> int:
    from ..cliargs import UsageError, called, resolve
    from .pipeline import audit
    from .settings import AuditSettings

    _check(args)
    source: Any = args.knowledge_base
    if not Path(source).exists():
        if ":" not in source:
            raise UsageError(
                f"no file {source!r}: give a .jsonl / .parquet file of {{id, text}}, or "
                "module:attribute of a LangChain vector store or LlamaIndex index"
            )
        named, source = source, resolve(source, "knowledge base")
        if callable(source):
            source = called(
                source,
                f"knowledge base {named!r}",
                "name a store, an index, or a function that takes none and returns one",
            )
    embedder: Any = args.embedder
    if embedder is not None and ":" in embedder and not Path(embedder).exists():
        named, embedder = embedder, resolve(embedder, "--embedder")
        if isinstance(embedder, type) or _takes_nothing(embedder):  # a class, a factory
            embedder = called(embedder, f"--embedder {named!r}")
    try:
        settings = AuditSettings(
            defenses=args.defense or AuditSettings().defenses,
            top_m=args.top_m,
            max_probes=args.max_probes,
            source_key=None if args.source_key.lower() == "none" else args.source_key,
            shards=args.shards,
            route=args.route,
        )
        report = audit(
            source,
            settings,
            queries=args.queries,
            embedder=embedder,
            workdir=args.workdir,
            fresh=args.fresh,
            engine=args.engine,
            address=args.address,
            workers=args.workers,
            progress=not args.quiet,
        )
    # OSErrors past the checks (a full disk, a store failing as it is read, its connection
    # dropped) fail the run below, exit 1; a query log or Ray cluster not found is checked first
    except (ValueError, TypeError, ImportError) as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        print(
            f"interrupted: the parts done are kept in {args.workdir}; the same command without "
            "--fresh resumes",
            file=sys.stderr,
        )
        return 130
    except Exception as exc:  # past the checks (a store failing as it is read): one line,
        where = traceback.extract_tb(exc.__traceback__)[-1]  # with where it was raised
        at = f" (at {Path(where.filename).name}:{where.lineno})"
        print(f"error: the audit failed: {type(exc).__name__}: {exc}{at}", file=sys.stderr)
        return 1
    try:
        written = report.write(args.workdir, args.format)
        for fmt in sorted(set(FORMATS) - set(args.format)):  # an earlier run's: not this one's
            if (stale := Path(args.workdir) / f"report.{fmt}").is_file():  # a folder: not ours
                stale.unlink()
    except OSError as exc:  # a full disk, a folder in a report's place: the run is kept
        print(
            f"error: cannot write the report in {args.workdir}: {exc}; the audit is kept there, "
            "and the same command writes it again without redoing the work",
            file=sys.stderr,
        )
        return 1
    # a terminal renders no HTML: its escapes (``&gt;=``) only hide the text (controls stay escaped)
    print(html.unescape(report.to_markdown(top=args.show)))
    print("written: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


def add_audit_parser(sub: Any) -> None:
    """Add ``audit`` to the ``ragdefense`` command's subparsers."""
    parser = sub.add_parser(
        "audit",
        help="audit a whole knowledge base for planted poison (ranked report of suspicious chunks)",
    )
    parser.add_argument(
        "knowledge_base",
        help="a .jsonl / .parquet file of {id, text, title?, embedding?, metadata?}, or "
        "module:attribute of a LangChain vector store or LlamaIndex index (or a function "
        "returning one)",
    )
    parser.add_argument(
        "--queries",
        default=None,
        help="the users' query log (.txt one per line, .jsonl / .json with question or query); "
        "default: probes derived from the corpus (titles, first sentences)",
    )
    parser.add_argument(
        "--defense",
        action="append",
        default=None,
        help="defense run on each probe's top M (repeatable; default consensus)",
    )
    parser.add_argument(
        "--embedder",
        default=None,
        help="the model the knowledge base was embedded with: a sentence-transformers model's "
        "folder, or module:attribute of an embedding model (LangChain, LlamaIndex, a function "
        "from texts to vectors), or of a class or function with no arguments making one; "
        "default the packaged all-MiniLM-L6-v2",
    )
    parser.add_argument(
        "--top-m", type=two_or_more, default=10, help="chunks per probe (default 10)"
    )
    parser.add_argument(
        "--max-probes", type=positive, default=None, help="at most this many derived probes"
    )
    parser.add_argument(
        "--source-key",
        default="auto",
        help="metadata key naming each chunk's source (default auto: source, url, file_path... "
        "as the defenses read them; none: provenance off)",
    )
    parser.add_argument(
        "--workdir",
        default="ragdefense-audit",
        help="working folder: resumable; the reports are written here (default ragdefense-audit)",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="start over: remove the audit's own files from the working folder first (a "
        "folder holding other files and no audit is refused)",
    )
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="where the steps run: this process (default), or Ray workers (--address, --workers)",
    )
    parser.add_argument(
        "--address", default=None, help="ray: a running cluster (default $RAY_ADDRESS, else local)"
    )
    parser.add_argument("--workers", type=positive, default=None, help="ray: actors per step")
    parser.add_argument(
        "--shards",
        type=positive,
        default=None,
        help="index shards (default one per worker, at most one per part of chunks)",
    )
    parser.add_argument(
        "--route",
        type=positive,
        default=None,
        help="search each chunk in its ROUTE nearest k-means shards only (default every shard)",
    )
    parser.add_argument(
        "--format",
        type=_formats,
        action="extend",
        default=None,
        help=f"report formats among {','.join(FORMATS)}, comma-separated or repeated (default "
        "md,json,csv and png where matplotlib is installed)",
    )
    parser.add_argument("--show", type=positive, default=20, help="rows printed (default 20)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.set_defaults(func=_cmd_audit)
