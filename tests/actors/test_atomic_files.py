"""The one atomic-write helper (ledger/store/atomic_files.py): whole files or none, and the
file and its directory both fsync-ed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ledger.store import atomic_files
from ledger.store.atomic_files import replace_directory, write_bytes_atomically


def test_a_write_replaces_the_file_whole_and_fsyncs_the_file_and_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "nested" / "witness.json"
    write_bytes_atomically(target, b"old")
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(atomic_files.os, "fsync",
                        lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                    real_fsync(fd)))

    write_bytes_atomically(target, b"new")

    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["witness.json"]
    assert synced[-1] == str(target.parent)  # the directory, after the rename
    assert synced[0].startswith(str(target.parent / ".witness.json.tmp-"))  # the file first


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()
    (target / "inside").write_text("keep")

    with pytest.raises(OSError):
        write_bytes_atomically(target, b"new")  # a non-empty directory cannot be replaced

    assert [p.name for p in tmp_path.iterdir()] == ["taken"]
    assert (target / "inside").read_text() == "keep"


def test_a_directory_appears_whole_under_its_new_name(tmp_path: Path) -> None:
    staging = tmp_path / "model.tmp"
    staging.mkdir()
    (staging / "config.json").write_text("{}")

    replace_directory(staging, tmp_path / "model")

    assert not staging.exists()
    assert (tmp_path / "model" / "config.json").read_text() == "{}"
