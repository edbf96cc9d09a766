"""Examples a user can copy (each folder: data generator, run.yaml, reward)."""
