"""MkDocs hook: the cookbook's notebooks live in cookbook/ (beside their checked sources), not in
docs/; they are added to the site here, before mkdocs-jupyter renders them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]


@event_priority(100)  # before mkdocs-jupyter's on_files, which picks the notebooks up
def on_files(files: Files, config: Any) -> Files:
    for notebook in sorted((ROOT / "cookbook").glob("*.ipynb")):
        files.append(
            File(
                f"cookbook/{notebook.name}",
                src_dir=str(ROOT),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files
