"""The run folder's integrity: one run at a time, a visible in-progress marker, a clean start.

- a lock (`.lock`, flock; removed when the run ends): a second run into a folder in use fails at once;
- `RUNNING` is written when a run starts and removed only after its report is written, so an
  interrupted or failed run is visible as such (the marker then says why);
- a run refuses a folder that holds an earlier run's outputs unless told to overwrite them; only
  the files and folders this project writes there are removed, never anything outside the folder;
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
from compressor.core.io import atomic_write_text, remove_stale_temporaries

OUTPUTS = ("masks.json", "head_scores.json", "metrics.json", "metrics.md", "report.md", "RUNNING", "plots")


class RunFolder:
    """Use as `with RunFolder(path, exports, overwrite) as folder: ...; folder.finish()`."""

    def __init__(self, path: Path, export_dirs: list[str] = (), overwrite: bool = False) -> None:
        self.path = Path(path)
        self.outputs = [*OUTPUTS, *export_dirs]
        self.overwrite = overwrite
        self._lock = None
        self._finished = False

    def earlier_outputs(self) -> list[str]:
        return [name for name in self.outputs if (self.path / name).exists()]

    def __enter__(self) -> RunFolder:
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"{self.path}: is a file; expected a run folder (or a path to create); use another --out")
        self.path.mkdir(parents=True, exist_ok=True)
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
        for name in earlier:
            target = self.path / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        remove_stale_temporaries(self.path)
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

    def __exit__(self, exc_type, exc, tb) -> None:  # noqa: ANN001
        if not self._finished and exc_type is not None and (self.path / "RUNNING").exists():
            why = "interrupted" if exc_type is KeyboardInterrupt else f"failed: {exc_type.__name__}: {exc}"
            marker = json.loads((self.path / "RUNNING").read_text())
            atomic_write_text(self.path / "RUNNING", json.dumps({**marker, "status": why}) + "\n")
        self._release()
