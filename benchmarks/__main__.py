"""``python -m benchmarks <setting>`` (see :mod:`benchmarks.cli`)."""

from .cli import main

raise SystemExit(main())
