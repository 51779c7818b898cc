"""Which folders this project wrote: a run folder and an export folder each carry a marker file.

Nothing is ever deleted or replaced unless its folder carries the marker of the kind expected
(`--overwrite` of a run, an export written over an earlier one), and nothing is written inside a
folder of the other kind (a run folder inside an export, predictions inside an export). A folder
without a marker may hold a user's own files: it is refused rather than cleaned.
"""

from __future__ import annotations

import json
from pathlib import Path

MARKERS = {"run": ".compressor-run", "export": ".compressor-export"}


def marker_text(kind: str) -> str:
    """The marker file's content: what wrote the folder (checked on reading, not just the name)."""
    return json.dumps({"written_by": "compressor", "kind": kind}) + "\n"


def write_marker(folder: Path, kind: str) -> None:
    """Mark `folder` (which exists) as a folder of `kind` written by this project."""
    (Path(folder) / MARKERS[kind]).write_text(marker_text(kind))


def is_marked(folder: Path, kind: str) -> bool:
    """`folder` carries this project's marker of `kind` (a real file, not a link, with the content it writes)."""
    marker = Path(folder) / MARKERS[kind]
    try:
        return marker.is_file() and not marker.is_symlink() and marker.read_text() == marker_text(kind)
    except (OSError, UnicodeDecodeError):
        return False


def marked_above(path: Path, kinds: tuple[str, ...] = ("run", "export")) -> Path | None:
    """The nearest folder above `path` that carries a marker of one of `kinds`, else None. Paths
    are resolved (links followed)."""
    for folder in Path(path).expanduser().resolve().parents:
        if any(is_marked(folder, kind) for kind in kinds):
            return folder
    return None


def kind_of(folder: Path) -> str:
    """'run' or 'export' for a marked folder (the first that matches), else 'folder'."""
    return next((kind for kind in MARKERS if is_marked(folder, kind)), "folder")
