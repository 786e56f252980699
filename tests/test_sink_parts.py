"""The HttpSink's parts, each without a server: the transport's verdicts, retries and backoff (against
httpx.MockTransport), the run opener (against a function that answers like POST /api/runs) and the
outbox (buffers, spool, bounded memory). End to end with a real collector: test_client.py,
test_sink_delivery.py."""
from __future__ import annotations

import json
import threading

import httpx
import numpy as np
import pyarrow as pa
import pytest

from forksight.base.runspec import RunSpec
from forksight.monitor.sinks.outbox import DeliveryError, Outbox
from forksight.monitor.sinks.run_open import RunOpener
from forksight.monitor.sinks.spool import Item, Spool
from forksight.monitor.sinks.transport import (MAX_SERVER_ERRORS, Backoff, Reply, Transport, verdict)


def _json_item(scalars: int = 2, samples: int = 1) -> Item:
    body = {"batch_id": "b1", "rank": 0, "scalars": [{"step": 0, "key": "k", "value": 1.0}] * scalars,
            "samples": [{"step": 0, "sample_id": 0}] * samples, "histograms": []}
    return Item("json", "b1", json.dumps(body).encode(), scalars + samples)


# ---------------------------------------------------------------------------- transport
@pytest.mark.parametrize("status, kind, want", [
    (None, "json", "retry"), (200, "json", "ack"), (201, "run", "ack"),
    (404, "run", "wait"), (404, "json", "lost-run"), (404, "status", "lost-run"),
    (400, "json", "refuse"), (401, "arrow", "refuse"), (409, "json", "refuse"), (413, "arrow", "refuse"),
    (422, "run", "refuse"), (429, "json", "retry"), (500, "json", "retry"), (503, "arrow", "retry"),
])
def test_what_each_answer_means(status, kind, want):
    assert verdict(status, kind) == want


def test_backoff_doubles_to_its_ceiling_and_resets():
    now = [100.0]
    backoff = Backoff(first=0.5, most=2.0, clock=lambda: now[0])
    assert not backoff.down()
    waits = []
    for _ in range(5):
        backoff.failed()
        waits.append(backoff.next_try - now[0])
        assert backoff.down()
    assert waits == [0.5, 1.0, 2.0, 2.0, 2.0] and backoff.failures == 5
    now[0] += 2.0
    assert not backoff.down()
    backoff.reset()
    backoff.failed()
    assert backoff.next_try - now[0] == 0.5


def _transport(handler, **kw) -> tuple[Transport, list]:
    alerts: list = []
    t = Transport("http://collector.test", rank=3, retries=3, retry_delay=0.001, on_alerts=alerts.extend,
                  transport=httpx.MockTransport(handler), **kw)
    t.run_id = "exp"
    return t, alerts


def test_an_acknowledged_batch_counts_its_rows_and_hands_on_its_alerts():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"stored": True, "alerts": [{"severity": "critical"}]})
    t, alerts = _transport(handler, token="s3cret")
    item = _json_item()
    assert t.send(item) is True and item.done
    assert t.sent_rows == 3 and alerts == [{"severity": "critical"}] and t.rejected == []
    assert (seen[0].method, seen[0].url.path) == ("POST", "/api/runs/exp/ingest")
    assert seen[0].headers["Authorization"] == "Bearer s3cret"


def test_tokens_go_as_arrow_with_batch_id_and_rank_and_an_offline_run_takes_the_collectors_id():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"run_id": "exp-2", "alerts": []})
    t, _ = _transport(handler)
    assert t.send(Item("arrow", "tb", b"ipc", 7))
    assert seen[0].headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    assert dict(seen[0].url.params) == {"batch_id": "tb", "rank": "3"} and seen[0].content == b"ipc"
    assert t.send(Item("run", "run", b'{"name": "exp"}')) and t.run_id == "exp-2"
    assert t.sent_rows == 7                          # a run request carries no rows


def test_an_unreachable_collector_is_tried_retries_times_then_left_for_later():
    calls = []

    def handler(request):
        calls.append(1)
        raise httpx.ConnectError("refused", request=request)
    t, _ = _transport(handler)
    item = _json_item()
    assert t.send(item) is False and not item.done
    assert len(calls) == 3 and t.rejected == [] and not t.refused


def test_a_refused_batch_is_not_retried_and_its_rows_are_counted_as_refused():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(422, text="scalars.0.value: not finite")
    t, _ = _transport(handler)
    item = _json_item(scalars=4, samples=2)
    assert t.send(item) is True and item.done        # done: it must not block the batches behind it
    assert len(calls) == 1
    assert t.refused == {"scalars": 4, "samples": 2}
    assert t.rejected == ["json batch b1: 422 scalars.0.value: not finite"]


def test_a_batch_the_collector_keeps_failing_on_is_given_up_after_max_server_errors():
    calls = []

    def handler(request):
        calls.append(1)
        return httpx.Response(503, text="busy")
    t, _ = _transport(handler)
    item = _json_item(scalars=1, samples=0)
    sends = 0
    while not item.done:
        assert t.send(item) is (len(calls) >= MAX_SERVER_ERRORS)
        sends += 1
    assert len(calls) == MAX_SERVER_ERRORS and sends == -(-MAX_SERVER_ERRORS // 3)   # 3 tries per send
    assert t.refused == {"scalars": 1} and "gave up after 20 answers 503" in t.rejected[0]


def test_a_lost_run_is_created_again_then_the_batch_goes_through():
    answers = iter([httpx.Response(404, text="unknown run"), httpx.Response(200, json={"alerts": []})])
    recreated = []
    t, _ = _transport(lambda request: next(answers), on_lost_run=lambda: recreated.append(1) or True)
    assert t.send(_json_item()) is True and recreated == [1] and t.sent_rows == 3


def test_a_lost_run_that_cannot_be_created_again_refuses_the_batch():
    t, _ = _transport(lambda request: httpx.Response(404, text="unknown run"), on_lost_run=lambda: False)
    assert t.send(_json_item()) is True and t.refused == {"scalars": 2, "samples": 1}


def test_a_joining_rank_before_rank_0_made_the_run_waits_without_refusing():
    t, _ = _transport(lambda request: httpx.Response(404, text="no live run"))
    item = Item("run", "run", b'{"name": "exp", "join": true}')
    assert t.send(item) is False and not item.done and t.rejected == []


# ---------------------------------------------------------------------------- run opener
class Collector:
    """Answers POST /api/runs from a list of replies (None: unreachable) and keeps the bodies."""

    def __init__(self, *replies):
        self.replies, self.bodies = list(replies), []

    def __call__(self, body: dict) -> Reply | None:
        self.bodies.append(body)
        return self.replies.pop(0)


def test_the_first_request_creates_resumes_or_joins():
    def first(**fields):
        return RunOpener(RunSpec(name="exp", strategy="fork", **fields), Collector()).first_request()
    assert first() == {"name": "exp", "project": "default", "strategy": "fork", "join": False}
    assert first(resume=True) == {"name": "exp", "project": "default", "strategy": "fork", "run_id": "exp"}
    assert first(rank=2) == {"name": "exp", "project": "default", "strategy": "fork", "join": True}
    assert first(rank=2, resume=True)["join"] is True       # only rank 0 resumes by id; the others join


def test_open_takes_the_collectors_id():
    collector = Collector(Reply(200, {"run_id": "exp-2"}, ""))
    assert RunOpener(RunSpec(name="exp"), collector).open() == ("exp-2", None)


def test_a_collector_down_files_the_same_request_to_replay():
    spec = RunSpec(name="exp", config={"lr": 0.1}, resume=True)
    run_id, create = RunOpener(spec, Collector(None)).open()
    assert run_id == "exp" and create.kind == "run"
    assert json.loads(create.body) == {"name": "exp", "project": "default", "config": {"lr": 0.1}, "run_id": "exp"}


def test_a_rank_waits_for_rank_0s_run_then_joins_it():
    collector = Collector(Reply(404, None, "no live run"), Reply(404, None, "no live run"),
                          Reply(200, {"run_id": "exp"}, ""))
    assert RunOpener(RunSpec(name="exp", rank=1), collector, poll=0.0).open() == ("exp", None)
    assert [b["join"] for b in collector.bodies] == [True, True, True]


def test_a_rank_that_finds_no_run_to_join_files_its_own():
    collector = Collector(Reply(404, None, "no live run"), Reply(200, {"run_id": "exp-2"}, ""))
    assert RunOpener(RunSpec(name="exp", rank=1), collector, join_wait=0.0).open() == ("exp-2", None)
    assert collector.bodies[1] == {"name": "exp", "project": "default"}


def test_a_refused_run_is_a_clear_error():
    collector = Collector(Reply(401, None, "missing bearer token"))
    with pytest.raises(RuntimeError, match="collector refused run 'exp': 401 missing bearer token"):
        RunOpener(RunSpec(name="exp"), collector).open()


def test_recreating_a_lost_run_asks_for_its_exact_id():
    collector = Collector(Reply(200, {"run_id": "exp-2"}, ""), Reply(500, None, ""), None)
    opener = RunOpener(RunSpec(name="exp", model="tiny"), collector)
    assert [opener.recreate("exp-2") for _ in range(3)] == [True, False, False]
    assert collector.bodies[0] == {"name": "exp", "project": "default", "model": "tiny", "run_id": "exp-2"}


# ---------------------------------------------------------------------------- outbox
def _tokens(n: int) -> pa.Table:
    return pa.table({"sample_id": np.zeros(n, np.int64), "pos": np.arange(n, dtype=np.int64)})


def _unwritable(tmp_path) -> Spool:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool directory should be")
    return Spool(blocker / "spool")


def test_buffered_rows_become_one_json_batch_and_arrow_batches_of_at_most_max_rows(tmp_path):
    woken = []
    box = Outbox(Spool(tmp_path / "spool"), max_batch_rows=250, wake=lambda: woken.append(1))
    box.append("scalars", [{"step": 0, "key": "k", "value": 1.0}] * 3, 3)
    box.append("samples", [{"step": 0, "sample_id": 0}], 1)
    assert not woken and not box.idle.is_set()
    box.append("tokens", [_tokens(200), _tokens(300)], 500)
    assert woken == [1]                               # a full batch wakes the sender
    assert box.undelivered() == {"scalars": 3, "samples": 1, "tokens": 500}
    box.take_buffers()
    groups = []
    while group := box.next_group():
        groups.append([(i.kind, i.rows) for i in group])
        for item in group:
            item.done = True
        box.drop_done()
    assert groups == [[("json", 4)], [("arrow", 250), ("arrow", 250)]]   # two token batches in flight at once
    assert box.undelivered() == {} and box.queued_bytes == 0
    box.settle()
    assert box.idle.is_set()


def test_the_queue_goes_to_the_spool_in_order_and_still_counts_as_undelivered(tmp_path):
    box = Outbox(Spool(tmp_path / "spool"))
    box.append("scalars", [{"step": 0, "key": "k", "value": 1.0}] * 2, 2)
    box.append("tokens", [_tokens(5)], 5)
    box.take_buffers()
    box.spool_queue()
    names = [p.name.split(".")[1] for p in box.spool.paths()]
    assert names == ["json", "arrow"] and box.next_group() == [] and not box.spool_refused
    assert box.undelivered() == {"scalars": 2, "tokens": 5}
    box.settle()
    assert not box.idle.is_set()                      # the spool is not empty: not idle


def test_an_unwritable_spool_keeps_requests_in_memory_in_order(tmp_path):
    box = Outbox(_unwritable(tmp_path))
    box.spool_or_hold(Item("run", "run", b"{}"))
    box.append("scalars", [{"step": 0, "key": "k", "value": 1.0}], 1)
    box.take_buffers()
    box.spool_queue()
    assert box.spool_refused and box.stuck()
    assert [i.kind for i in box.next_group()] == ["run"]
    assert box.held_in_memory() == 1 and box.undelivered() == {"scalars": 1}


def test_full_memory_pushes_back_then_raises_and_everything_accepted_is_still_held(tmp_path):
    held = _json_item(scalars=2, samples=1)
    n = len(held.body)
    box = Outbox(_unwritable(tmp_path), max_memory_bytes=n - 1, backpressure_timeout=0.05)
    box.push([held])                                   # over the bound: the next append must wait
    with pytest.raises(DeliveryError, match=f"{n} bytes wait in memory .limit {n - 1}.; refusing more rows"):
        box.append("scalars", [{"step": 0, "key": "k", "value": 1.0}], 1)
    assert box.undelivered() == {"scalars": 2, "samples": 1}   # the request held; the refused row never entered


def test_a_writer_waiting_for_room_goes_on_once_the_sender_frees_it(tmp_path):
    woken = threading.Event()
    held = _json_item()
    box = Outbox(_unwritable(tmp_path), max_memory_bytes=len(held.body) - 1, backpressure_timeout=60.0,
                 wake=woken.set)
    box.push([held])
    errors: list = []

    def writer():
        try:
            box.append("scalars", [{"step": 1, "key": "k", "value": 2.0}], 1)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    thread = threading.Thread(target=writer)
    thread.start()
    assert woken.wait(10)                              # it asked the sender to make room
    held.done = True                                   # the sender delivered the held request
    box.drop_done()
    box.settle()
    thread.join(10)
    assert not thread.is_alive() and errors == []
    assert box.undelivered() == {"scalars": 1}
