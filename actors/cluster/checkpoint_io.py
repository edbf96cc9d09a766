"""Checkpoint storage through fsspec: one URL names one place for every node of a cluster.

A location is an absolute path (``/shared/ckpt``, taken as ``file:///shared/ckpt``) or an
fsspec URL (``file://``, ``s3://``, ``gs://``, ``memory://``...). A relative path is refused:
each actor would resolve it in its own working directory (the raylet's), i.e. somewhere else on
every node.

Writes are atomic for a reader: on a local or mounted file system the bytes go to a temporary
name beside the target, fsync-ed, renamed over it and the directory fsync-ed
(:func:`ledger.store.atomic_files.write_bytes_atomically`, the one atomic write); an object store's put is
already all-or-nothing, so the target is written directly. A crash mid-write leaves the older
file (or none), never half a checkpoint.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

from actors.errors import StorageError
from ledger.store.atomic_files import write_bytes_atomically

__all__ = [
    "StorageError",
    "is_local",
    "is_readable",
    "join_url",
    "list_names",
    "local_path",
    "read_bytes",
    "to_url",
    "write_bytes_atomic",
]


def to_url(location: str) -> str:
    """``location`` as a URL: an absolute path becomes ``file://PATH``; a URL is kept.

    Raises:
        StorageError: a relative path.
    """
    if "://" in location:
        return location
    if not os.path.isabs(location):
        raise StorageError(f"{location!r} is a relative path: use an absolute path or a URL "
                           "(file://, s3://, ...) that every node resolves the same way")
    return "file://" + os.path.normpath(location)


def join_url(base: str, name: str) -> str:
    """``base/name`` for a URL (no normalisation of the protocol part)."""
    return f"{base.rstrip('/')}/{name}"


def _filesystem(url: str) -> tuple[Any, str]:
    import fsspec

    try:
        return fsspec.core.url_to_fs(to_url(url))
    except (ImportError, ValueError) as exc:
        raise StorageError(f"cannot use {url}: {exc}") from None


def is_local(url: str) -> bool:
    """True if ``url`` is on a file system this process sees as files (``file://``, a path)."""
    filesystem, _ = _filesystem(url)
    return "file" in _protocols(filesystem)


def local_path(url: str) -> str | None:
    """The file path behind a ``file://`` URL or absolute path, else None."""
    filesystem, path = _filesystem(url)
    return path if "file" in _protocols(filesystem) else None


def _protocols(filesystem: Any) -> tuple[str, ...]:
    protocol = filesystem.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def write_bytes_atomic(url: str, data: bytes) -> str:
    """Write ``data`` to ``url`` so that a reader sees the old content or all of the new.

    Creates missing parent directories. Returns the URL written (normalised by :func:`to_url`).
    Safe to retry.

    Raises:
        StorageError: a relative path or unusable URL. OSError: the write failed; an older
            object at ``url`` is unchanged.
    """
    url = to_url(url)
    filesystem, path = _filesystem(url)
    parent = str(PurePosixPath(path).parent)
    if "file" not in _protocols(filesystem):
        filesystem.makedirs(parent, exist_ok=True)
        filesystem.pipe_file(path, data)  # an object put is all-or-nothing
        return url
    write_bytes_atomically(path, data)  # fsync of the file and of its directory
    return url


def read_bytes(url: str) -> bytes:
    """The whole object at ``url``.

    Raises:
        StorageError: a relative path or unusable URL. FileNotFoundError: nothing there.
            OSError: it could not be read.
    """
    filesystem, path = _filesystem(url)
    return filesystem.cat_file(path)


def is_readable(url: str) -> bool:
    """Whether the object at ``url`` exists and its first byte can be read from here."""
    try:
        filesystem, path = _filesystem(url)
        with filesystem.open(path, "rb") as handle:
            handle.read(1)
    except OSError:
        return False
    return True


def list_names(url: str) -> list[str]:
    """The names of the objects directly under ``url`` (a directory), sorted; [] if absent.

    Raises:
        StorageError: a relative path or unusable URL. OSError: it could not be listed.
    """
    filesystem, path = _filesystem(url)
    try:
        entries = filesystem.ls(path, detail=False)
    except FileNotFoundError:
        return []
    return sorted(PurePosixPath(str(entry)).name for entry in entries)
