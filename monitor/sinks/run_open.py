"""How an HttpSink gets its run: create it (its name unless taken), resume it (exactly this id), or
join it (ranks > 0: the live run of that name, once rank 0 made it); filed as a request to replay
when the collector is down; and created again when a fresh collector no longer knows it."""
from __future__ import annotations

import json
import logging
import time
from typing import Callable

from forksight.base.runspec import RunSpec
from forksight.monitor.sinks.spool import Item
from forksight.monitor.sinks.transport import Reply

log = logging.getLogger("forksight.client")


class RunOpener:
    """Opens `spec`'s run through `post` (POST /api/runs with a JSON body -> Reply, None when the
    collector cannot be reached). join_wait: how long a rank > 0 waits for rank 0's run."""

    def __init__(self, spec: RunSpec, post: Callable[[dict], Reply | None], *, where: str = "the collector",
                 join_wait: float = 30.0, poll: float = 0.5):
        self.spec, self.post, self.where = spec, post, where
        self.join_wait, self.poll = join_wait, poll

    def first_request(self) -> dict:
        """resume: rank 0 continues the run with exactly this id (upsert), not name-2; otherwise
        create by name, or (ranks > 0) join the live run of that name."""
        body = self.spec.create_body()
        if self.spec.resume and not self.spec.rank:
            return {**body, "run_id": self.spec.name}
        return {**body, "join": self.spec.rank > 0}

    def open(self) -> tuple[str, Item | None]:
        """The run id, and None; or, when the collector is down, the name and the request that
        creates the run, to replay ahead of its batches like the online path would have sent it
        (name unless taken, never into an old run of that name; the exact id on resume; the live
        run of that name for ranks > 0). Raises RuntimeError when the collector refuses the run."""
        spec, first = self.spec, self.first_request()
        deadline = time.monotonic() + (self.join_wait if spec.rank else 0.0)
        while True:
            reply = self.post(first)
            if reply is None:
                return spec.name, self._offline(first)
            if reply.status == 404 and spec.rank and time.monotonic() < deadline:
                time.sleep(self.poll)         # rank 0 has not created the run yet
                continue
            break
        if reply.status == 404 and spec.rank:  # no live run to join: this rank files its own
            body = spec.create_body()
            reply = self.post(body)
            if reply is None:
                return spec.name, self._offline(body)
        if reply.status >= 400:
            raise RuntimeError(f"collector refused run {spec.name!r}: {reply.status} {reply.text}")
        return reply.body["run_id"], None

    def _offline(self, body: dict) -> Item:
        log.warning("forksight: collector %s unreachable; spooling run %r to disk until it answers",
                    self.where, self.spec.name)
        return Item("run", "run", json.dumps(body).encode())

    def recreate(self, run_id: str) -> bool:
        """Create `run_id` again (a fresh collector on a new file lost it); True once it exists."""
        reply = self.post({**self.spec.create_body(), "run_id": run_id})
        return reply is not None and reply.status < 400
