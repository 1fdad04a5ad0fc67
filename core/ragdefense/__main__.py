"""``python -m ragdefense``: the ``ragdefense`` command."""

from .cli import main

raise SystemExit(main())
