"""forksight.monitor.sinks: what producers log through (HTTP to a collector, or nothing).
Producers import this room and never the collector's."""
