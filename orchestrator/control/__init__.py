"""The control plane: the main job's story (driver), liveness and replacement (supervisor),
indep-dp cells (cells), weight publishing (publisher), engines, actor creation (launch)."""
