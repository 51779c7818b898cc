"""The run folder's integrity: one run at a time, a visible in-progress marker, a clean start.

- a lock (`.lock`, flock; removed when the run ends): a second run into a folder in use fails at once;
- `RUNNING` is written when a run starts and removed only after its report is written, so an
  interrupted or failed run is visible as such (the marker then says why);
- a run refuses a folder that holds an earlier run's outputs unless told to overwrite them; only
  the files and folders this project writes there are removed, and only from a folder that carries
  the run marker (`.compressor-run`), an export folder only when it carries the export marker: a
  folder without them may hold a user's own files and is refused, never cleaned;
- a run never starts inside another run folder or an export folder;
- a run refused for bad input (an InputError: the preflight, a missing file) before it wrote any
  output leaves the folder as it found it: a folder it created is removed again;
- temporary files an interrupted earlier run left behind are deleted.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from pathlib import Path

from compressor.core.errors import InputError
from compressor.core.folders import MARKERS, is_marked, kind_of, marked_above, write_marker
from compressor.core.io import atomic_write_text, remove_stale_temporaries

OUTPUTS = ("masks.json", "head_scores.json", "metrics.json", "metrics.md", "report.md", "RUNNING", "plots")


def check_run_location(path: Path) -> None:
    """A one-line InputError for a run folder that is a file, an export folder, or inside another
    run or export folder (its --overwrite would then damage that one)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{path}: is a file; expected a run folder (or a path to create); use another --out")
    if is_marked(path, "export"):
        raise InputError(f"{path}: is an export folder; expected a run folder of its own (use another --out)")
    above = marked_above(path)
    if above is not None:
        raise InputError(
            f"{path}: inside the {kind_of(above)} folder {above}; expected a run folder of its own (use another --out)"
        )


def check_removable(path: Path, earlier: list[str], export_dirs: list[str]) -> None:
    """--overwrite removes `earlier` only from a folder this project marked, and an export folder
    only when it carries the export marker."""
    if not is_marked(path, "run"):
        raise InputError(
            f"{path}: holds {', '.join(earlier)} but no .compressor-run marker (not a run folder this version "
            "wrote); --overwrite removes only a marked run's outputs; move them or use another --out"
        )
    for name in earlier:
        if name in export_dirs and (path / name).is_dir() and not is_marked(path / name, "export"):
            raise InputError(
                f"{path / name}: export.dir names a folder without the .compressor-export marker "
                "(not an export this version wrote); --overwrite will not replace it; choose another export.dir"
            )


class RunFolder:
    """Use as `with RunFolder(path, exports, overwrite) as folder: ...; folder.finish()`."""

    def __init__(self, path: Path, export_dirs: list[str] = (), overwrite: bool = False) -> None:
        self.path = Path(path)
        self.export_dirs = list(export_dirs)
        self.outputs = [*OUTPUTS, *export_dirs]
        self.overwrite = overwrite
        self._lock = None
        self._finished = False
        self._created: Path | None = None  # the outermost folder this run created, if any
        self._found: set[str] | None = None  # the names the folder held (None: this run removed some)

    def earlier_outputs(self) -> list[str]:
        return [name for name in self.outputs if (self.path / name).exists()]

    def __enter__(self) -> RunFolder:
        check_run_location(self.path)
        missing = [p for p in (self.path, *self.path.parents) if not p.exists()]
        self._created = missing[-1] if missing else None
        self.path.mkdir(parents=True, exist_ok=True)
        self._found = {p.name for p in self.path.iterdir()}
        self._lock = open(self.path / ".lock", "w")  # noqa: SIM115 - held until __exit__
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock_path = self.path / ".lock"
            if not lock_path.exists() or os.fstat(self._lock.fileno()).st_ino != lock_path.stat().st_ino:
                raise BlockingIOError  # a run that just finished removed the file we locked: not ours
        except BlockingIOError as e:
            self._lock.close()
            self._lock = None
            raise InputError(
                f"{self.path}: another compressor run is using this folder (locked); wait or use --out"
            ) from e
        earlier = self.earlier_outputs()
        if earlier and not self.overwrite:
            self._release()
            raise InputError(
                f"{self.path}: holds an earlier run's outputs ({', '.join(earlier)}); "
                "pass --overwrite to replace them, or --out for another folder"
            )
        if earlier:
            try:
                check_removable(self.path, earlier, self.export_dirs)
            except InputError:
                self._release()
                raise
        if earlier:
            self._found = None
        for name in earlier:
            target = self.path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        remove_stale_temporaries(self.path)
        write_marker(self.path, "run")
        marker = {"pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "status": "running"}
        atomic_write_text(self.path / "RUNNING", json.dumps(marker) + "\n")
        return self

    def finish(self) -> None:
        """The run completed and its report is written: drop the marker."""
        (self.path / "RUNNING").unlink(missing_ok=True)
        self._finished = True

    def _release(self) -> None:
        """Remove the lock file (while still holding it), then unlock: no `.lock` stays behind."""
        if self._lock is not None:
            (self.path / ".lock").unlink(missing_ok=True)
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def _undo_if_untouched(self) -> bool:
        """Leave the folder as found when this run wrote nothing but its bookkeeping; True if so."""
        bookkeeping = {"RUNNING", ".lock", MARKERS["run"]}
        if self._found is None or any(p.name not in self._found | bookkeeping for p in self.path.iterdir()):
            return False
        (self.path / "RUNNING").unlink(missing_ok=True)
        if MARKERS["run"] not in self._found:  # written by this run
            (self.path / MARKERS["run"]).unlink(missing_ok=True)
        self._release()
        if self._created is not None:
            for folder in (self.path, *self.path.parents):  # up to the outermost it created, while empty
                if any(folder.iterdir()):
                    break
                folder.rmdir()
                if folder == self._created:
                    break
        return True

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if not self._finished and exc_type is not None and issubclass(exc_type, InputError):
            if self._undo_if_untouched():
                return
        if not self._finished and exc_type is not None and (self.path / "RUNNING").exists():
            why = "interrupted" if exc_type is KeyboardInterrupt else f"failed: {exc_type.__name__}: {exc}"
            marker = json.loads((self.path / "RUNNING").read_text())
            atomic_write_text(self.path / "RUNNING", json.dumps({**marker, "status": why}) + "\n")
        self._release()
