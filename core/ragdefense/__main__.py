"""``python -m ragdefense``: the ``ragdefense`` command."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
