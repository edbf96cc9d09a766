"""Recovery drills: the runner, scenarios with their fault primitives, and the drill checker."""
