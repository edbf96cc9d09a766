"""The run's checkpoint directory: one URL that every node (and a replacement) reads.

``--checkpoint-dir`` is an absolute path or an fsspec URL (``file://``, ``s3://``, ...); by
default it is the run directory's ``checkpoints/``, made absolute on the driver. Cell
checkpoints (``step-NNNNNN.pt``) and the rollout manager's state are named as in
:class:`ledger.run_layout.RunLayout`; the ledger's ``checkpoint_saved`` records
the full URL. Writes are atomic (:mod:`actors.cluster.checkpoint_io`).

The rollout manager's state (rebuilt from the ledger by the driver for a resume or a
replacement manager) is a file the manager reads through a path: on a ``file://`` location it
is written there; on an object store it stays in the driver's run directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.cluster.checkpoint_io import is_readable, join_url, to_url
from ledger.run_layout import RunLayout
from orchestrator.config import RunConfig
from orchestrator.errors import StartupError

if TYPE_CHECKING:
    from orchestrator.control.supervision.cell_group import CellGroup

__all__ = ["CheckpointStore"]


class CheckpointStore:
    """Where one run's checkpoints and manager states are, as URLs.

    Args:
        base_url: the checkpoint directory (an absolute path or a URL).
        layout: the run layout whose file names are used.

    Raises:
        StartupError: ``base_url`` is a relative path.
    """

    def __init__(self, base_url: str, layout: RunLayout) -> None:
        try:
            self.url = to_url(base_url)
        except OSError as exc:
            raise StartupError(f"--checkpoint-dir: {exc}") from None
        self.layout = layout

    @classmethod
    def of(cls, config: RunConfig, layout: RunLayout) -> CheckpointStore:
        """The run's store: ``config.checkpoint_dir``, else the run directory's
        ``checkpoints/`` made absolute here (the driver's working directory, not a worker's)."""
        return cls(config.checkpoint_dir or str(layout.checkpoint_dir.resolve()), layout)

    def checkpoint_url(self, train_step: int) -> str:
        """The cells' checkpoint after ``train_step`` steps."""
        return join_url(self.url, self.layout.checkpoint_path(train_step).name)

    def require_readable(self, url: str, cells: CellGroup | None = None,
                         timeout_s: float = 60.0) -> None:
        """Check that the driver, and every alive cell of ``cells`` on its own node, can read
        ``url`` (a checkpoint to resume from). Reads nothing but a first byte; writes nothing.

        Raises:
            StartupError: one of them cannot (one line naming the URL and who).
        """
        if not is_readable(url):
            raise StartupError(f"checkpoint {url} is not readable from the driver's node; "
                               "is --checkpoint-dir on storage every node shares?")
        if cells is None:
            return
        calls = {cell_id: cells.actor(cell_id).checkpoint_readable.remote(url)
                 for cell_id in cells.alive_ids()}
        answers, failed = cells.call_each(calls, timeout_s)
        unable = sorted(failed) + sorted(c for c, readable in answers.items() if not readable)
        if unable:
            raise StartupError(f"checkpoint {url} is not readable from the node of "
                               f"{', '.join(unable)}; is --checkpoint-dir on storage every "
                               "node shares?")
