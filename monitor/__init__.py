"""forksight.monitor, three rooms: `sinks` (what producers log through), `collector` (HTTP API,
ingest, DuckDB store, reader) and `alerts` (detectors and the per-run hub)."""
