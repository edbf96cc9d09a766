"""What a run reports as it goes: the progress bar, metrics.jsonl lines, experiment trackers."""
