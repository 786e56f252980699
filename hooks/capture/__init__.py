"""forksight.hooks.capture: where a training forward is observed (forward hooks), turned into
per-token statistics, buffered by step and reported to a sink (`attach`)."""
