"""Starting and stopping the lake beside a store: the outbox hook, start-time recovery, the committer."""
from __future__ import annotations

from forksight.monitor.lake.committer import Committer
from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.outbox import Outbox
from forksight.monitor.lake.settings import DEFAULT_COMMIT_ROWS, DEFAULT_COMMIT_SECONDS, LakeSettings

__all__ = ["DEFAULT_COMMIT_ROWS", "DEFAULT_COMMIT_SECONDS", "start_lake", "start_lake_with"]


def start_lake_with(settings: LakeSettings, store, catalog) -> Committer:
    """start_lake from the one settings object (what `forksight serve --lake-*` gives)."""
    shown = settings.shown()
    return start_lake(store, catalog, uri=shown["catalog"], warehouse=settings.warehouse,
                      collector_id=settings.collector_id, commit_rows=settings.commit_rows,
                      commit_seconds=settings.commit_seconds, options=shown["options"],
                      deadline=settings.call_deadline_s, scrub=settings.scrub)


def start_lake(store, catalog, *, uri: str, warehouse: str, collector_id: str | None = None,
               commit_rows: int = DEFAULT_COMMIT_ROWS, commit_seconds: float = DEFAULT_COMMIT_SECONDS,
               writer_process: bool = True, options: dict | None = None,
               deadline: float | None = None, scrub=None) -> Committer:
    """Attach the outbox to `store` (every later write fills it in its own transaction), drop what the
    lake already holds, start the committer and report it in the store's health. writer_process: the
    Iceberg commits run in a child process at the lowest priority (writer_process.py), else in the
    committer's thread. Stop it before closing the store: committer.stop()."""
    if commit_rows < 1 or not commit_seconds > 0:
        raise LakeError(f"--lake-commit-rows must be >= 1 and --lake-commit-seconds > 0 "
                        f"(got {commit_rows} and {commit_seconds})")
    outbox = Outbox(store, collector_id)
    writer = None
    if writer_process:
        from forksight.monitor.lake.writer_process import ProcessWriter

        try:
            writer = ProcessWriter(catalog, outbox.collector_id, deadline=deadline)
        except Exception as exc:  # noqa: BLE001 - said as the lake's start error
            raise LakeError(f"cannot start the lake writer process ({scrub(str(exc)) if scrub else exc})") from None
    committer = Committer(store, outbox, catalog, uri=uri, warehouse=warehouse,
                          commit_rows=commit_rows, commit_seconds=commit_seconds, writer=writer, options=options,
                          scrub=scrub)
    try:
        committer.recover()
    except LakeError:
        committer.writer.close()
        raise
    except Exception as exc:  # noqa: BLE001 - the catalog answered at open and fails now: said the same way
        committer.writer.close()
        said = committer.scrub(f"{type(exc).__name__}: {exc}")
        raise LakeError(f"cannot read the lake's committed ranges ({said}); "
                        "check the catalog is reachable") from None
    store.attach_lake(outbox, committer.health)
    committer.start()
    return committer
