"""Atomic local file writes: the one helper every package uses (the ledger's witnesses, the
actors' checkpoints, a generated model directory).

A reader sees the old content or all of the new, also after a crash: the bytes go to a
temporary name in the target's directory, are flushed and ``fsync``-ed, renamed over the
target (``os.replace``, atomic on POSIX within one file system), and then the directory is
``fsync``-ed, so the rename itself is durable. Without the last step a power loss after the
rename may bring back the old name, or none.

Standard library only: the ledger imports it (no Ray, no torch), and so may anything else.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["fsync_directory", "replace_directory", "write_bytes_atomically",
           "write_text_atomically"]


def fsync_directory(directory: Path | str) -> None:
    """``fsync`` a directory, making the creations and renames in it durable.

    Raises:
        OSError: the directory cannot be opened.
    """
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_bytes_atomically(target: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically and durably (see the module docstring).

    Creates missing parent directories. Safe to retry; concurrent writers each leave a whole
    file (the last rename wins).

    Raises:
        OSError: the write failed; an older file at ``target`` is unchanged and no temporary
            file is left behind.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_directory(target.parent)
    return target


def write_text_atomically(target: Path | str, text: str, encoding: str = "utf-8") -> Path:
    """:func:`write_bytes_atomically` of ``text`` encoded with ``encoding``."""
    return write_bytes_atomically(target, text.encode(encoding))


def replace_directory(temporary: Path | str, target: Path | str) -> Path:
    """Make the directory ``temporary`` (fully written) appear as ``target``, durably: every
    file in it is ``fsync``-ed, then it is renamed, then the parent is ``fsync``-ed.

    Raises:
        OSError: the rename failed (for instance ``target`` exists and is not empty); the
            caller decides whether that is an error.
    """
    temporary, target = Path(temporary), Path(target)
    for path in sorted(temporary.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    fsync_directory(temporary)
    os.replace(temporary, target)
    fsync_directory(target.parent)
    return target
