"""Publishing weights: THE weight-update sequence and what it is made of.

- ``actors.publishing.sequence``: :func:`update_weights`, the one sequence (DESIGN section 5),
  its named fault points (``UpdatePoint``) and its report (the committed head).
- ``actors.publishing.records``: the publisher cell's fenced, idempotent ledger writes.
- ``actors.publishing.weight_sync``: the engine side (pause, stage, load, the one
  ``finalize_and_resume_engines``).

``actors.train_cell.TrainCell.update_weights`` runs the sequence with the cell's weights.
"""
