"""The Iceberg lake a collector writes beside its DuckDB file (docs/lake.md): an outbox filled in the
write's own transaction, a committer thread draining it exactly once, and the lake's maintenance.
Needs the `lake` extra (pyiceberg); the collector imports none of it unless --lake-catalog is given."""
