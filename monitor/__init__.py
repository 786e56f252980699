"""forksight.monitor: the metrics core, the DuckDB store, the collector and its client."""
