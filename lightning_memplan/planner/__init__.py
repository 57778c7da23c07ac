"""Planning a Lightning training step: settings, the step model, the plan search and
activation checkpointing of chosen blocks."""
