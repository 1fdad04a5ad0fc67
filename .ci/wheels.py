"""Print each built wheel's size and files, and fail if a wheel ships the research harness
(`benchmarks/`) or any test, or lacks its licence (`make dist`, `make smoke`)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def main(folder: str) -> int:
    wheels = sorted(Path(folder).glob("*.whl"))
    if not wheels:
        print(f"no wheel in {folder}", file=sys.stderr)
        return 1
    bad = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            names = sorted(n for n in zf.namelist() if not n.endswith("/"))
        print(f"{wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB, {len(names)} files")
        for name in names:
            print(f"  {name}")
        top = {n.split("/")[0] for n in names}
        bad += [f"{wheel.name}: {n}" for n in names if n.split("/")[0] in {"benchmarks", "tests"}]
        bad += [f"{wheel.name}: {t}" for t in top if t.startswith("bench")]
        if not any(n.endswith(".dist-info/licenses/LICENSE") for n in names):
            bad.append(f"{wheel.name}: no LICENSE (the Apache-2.0 text must ship with it)")
    if bad:
        print("wheels not fit to ship:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "dist"))
