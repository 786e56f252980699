"""The row ledger beside a store's file (<db>.rows): rows acknowledged per table. DuckDB replays a
truncated or deleted .wal silently; comparing the file with the ledger at open makes such a loss
visible, and the ledger keeps reporting it (health, dashboard) until someone acknowledges it."""
from __future__ import annotations

import json
import logging
import os
import time

log = logging.getLogger("forksight.store")


class Ledger:
    """Acknowledged rows per table, and rows found lost, kept in `<path>.rows` (atomic rewrites)."""

    def __init__(self, path: str, counts: dict[str, int]):
        """counts: rows per table the file holds now (just opened)."""
        self.path, self.file = path, path + ".rows"
        self.rows = dict(counts)
        self.lost: dict[str, int] = {}
        self.lost_since: float | None = None
        found: dict[str, int] = {}
        try:
            with open(self.file) as f:
                recorded = json.loads(f.read())
            if recorded.get("inode") == os.stat(path).st_ino:     # the ledger of this very file
                found = {t: n - counts[t] for t, n in recorded["rows"].items() if counts.get(t, n) < n}
                self.lost = {t: int(n) for t, n in (recorded.get("lost") or {}).items()}
                self.lost_since = recorded.get("lost_since")
        except (OSError, ValueError, KeyError, AttributeError, TypeError):
            pass
        if found:
            log.error("%s: %s row(s) acknowledged earlier are not in the file (its .wal was damaged or truncated "
                      "before it reached the file); serving the %s rows it holds", path, found, counts)
            for table, n in found.items():
                self.lost[table] = self.lost.get(table, 0) + n
            self.lost_since = self.lost_since or time.time()
        self.found = found              # lost at this open (Store.missing_rows)
        self.write()

    def count(self, added: dict[str, int]) -> None:
        for name, n in added.items():
            self.rows[name] = self.rows.get(name, 0) + n
        self.write()

    def acknowledge(self) -> dict[str, int]:
        """Forget the reported loss (an operator has seen it); returns what was reported."""
        lost, self.lost, self.lost_since = self.lost, {}, None
        self.write()
        return lost

    def write(self) -> None:
        try:
            tmp = self.file + ".tmp"
            with open(tmp, "w") as f:
                f.write(json.dumps({"inode": os.stat(self.path).st_ino, "rows": self.rows, "lost": self.lost,
                                    "lost_since": self.lost_since}))
            os.replace(tmp, self.file)
        except OSError:
            pass                  # a read-only directory or a full disk: the store works, without this check
