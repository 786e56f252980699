"""forksight.monitor.collector: the HTTP API over one DuckDB store, its ingest path and its one
reader. It never imports a producer or the dashboard."""
