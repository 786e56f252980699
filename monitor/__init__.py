"""forksight.monitor: the collector room. Client sinks, the HTTP collector, the DuckDB store and its reader, alerts."""
