"""The collector's parts started and stopped in one order, for `forksight serve` and the in-process
Collector (the embedded default) alike: the store opens first, the lake attaches to it (its committer
drains the outbox the store fills), the app serves both; on stop the app has already stopped taking
writes, the lake drains one last time while the store still answers, then the store closes."""
from __future__ import annotations

from forksight.monitor.collector.store import Store


class CollectorParts:
    """The store and (with lake settings and their opened catalog) the lake's committer over it."""

    def __init__(self, db: str, *, lake_settings=None, catalog=None, **store_options):
        self.store = Store(db, **store_options)
        self.lake = None
        if lake_settings is not None:
            from forksight.monitor.lake.service import start_lake_with

            try:
                self.lake = start_lake_with(lake_settings, self.store, catalog)
            except BaseException:
                self.store.close()
                raise

    def close(self) -> None:
        """Stop the lake (its last drain, while the store still answers), then close the store."""
        try:
            if self.lake is not None:
                self.lake.stop()
        finally:
            self.store.close()
