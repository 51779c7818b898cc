"""The run folder: one run at a time (a lock that leaves no file behind), earlier outputs refused
unless overwritten (and nothing else removed), an interrupted run marked as such."""

import json
import time

import pytest
import yaml

from compressor.core.folders import write_marker
from compressor.run.cli import main
from compressor.run.runfolder import RunFolder

from .test_bad_inputs import RECIPE


def test_a_locked_run_folder_fails_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(RECIPE))
    with RunFolder(tmp_path / "runs" / "bad"):
        t0 = time.time()
        code = main(["apply", str(path)])
        err = capsys.readouterr().err
    assert code == 2 and "another compressor run is using this folder (locked)" in err and time.time() - t0 < 30


def test_earlier_outputs_are_refused_unless_overwritten(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "report.md").write_text("old")
    (folder / ".masks.json.abc.tmp").write_text("left by a kill")
    (folder / "mine.txt").write_text("a user's file")
    with pytest.raises(Exception, match="holds an earlier run's outputs \\(report.md\\); pass --overwrite"):
        with RunFolder(folder):
            pass
    with pytest.raises(Exception, match="holds report.md but no .compressor-run marker"):
        with RunFolder(folder, overwrite=True):  # not marked as a run folder: a user's files, never cleaned
            pass
    assert (folder / "report.md").read_text() == "old"
    write_marker(folder, "run")
    with RunFolder(folder, overwrite=True) as rf:
        assert not (folder / "report.md").exists() and not (folder / ".masks.json.abc.tmp").exists()
        assert (folder / "RUNNING").exists() and (folder / "mine.txt").read_text() == "a user's file"
        rf.finish()
    assert not (folder / "RUNNING").exists()
    assert not (folder / ".lock").exists(), "a finished run leaves no lock file"


def test_a_lock_file_removed_under_a_waiting_run_is_not_taken_as_ours(tmp_path, monkeypatch):
    """A run that opened `.lock` just before the holder finished and removed it would lock a file
    no other run sees: it must refuse, not run beside the next one."""
    import fcntl

    from compressor.run import runfolder

    folder = tmp_path / "run"
    folder.mkdir()
    real_flock = fcntl.flock

    def race(fd, op):  # between our open and our flock, the holder removes the file and a new run creates it
        (folder / ".lock").unlink()
        (folder / ".lock").write_text("")
        return real_flock(fd, op)

    monkeypatch.setattr(runfolder.fcntl, "flock", race)
    with pytest.raises(Exception, match="another compressor run is using this folder"):
        with RunFolder(folder):
            pass


def test_an_interrupted_run_stays_marked(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with RunFolder(tmp_path / "run"):
            raise KeyboardInterrupt
    assert json.loads((tmp_path / "run" / "RUNNING").read_text())["status"] == "interrupted"


def test_a_run_refused_before_writing_leaves_the_folder_as_found(tmp_path):
    """Bad input found by the preflight: a folder the run created (parents included) is removed again;
    an existing folder keeps what it held and gets no marker; an interrupt still leaves its marker."""
    from compressor.core.errors import InputError
    from compressor.core.folders import MARKERS

    with pytest.raises(InputError):
        with RunFolder(tmp_path / "runs" / "new"):
            raise InputError("model.name: bad")
    assert not (tmp_path / "runs").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    with pytest.raises(InputError):
        with RunFolder(mine):
            raise InputError("model.name: bad")
    assert (mine / "notes.txt").read_text() == "a user's file" and not (mine / "RUNNING").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError):
        with RunFolder(empty):
            raise InputError("model.name: bad")
    assert empty.is_dir() and not any(empty.iterdir())  # existed before: kept, without a marker
    with pytest.raises(InputError):
        with RunFolder(tmp_path / "half"):
            (tmp_path / "half" / "masks.json").write_text("{}")  # an output was written: kept, marked failed
            raise InputError("steps[1]: bad")
    assert json.loads((tmp_path / "half" / "RUNNING").read_text())["status"].startswith("failed")
    assert (tmp_path / "half" / MARKERS["run"]).exists()
