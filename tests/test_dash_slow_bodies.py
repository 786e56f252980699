"""Slow request bodies to the dashboard cannot freeze it: 12 clients trickling bytes to
/_dash-update-component (a2wsgi has 10 WSGI threads, and the callback guard read bodies on them)
froze GET / and every callback for as long as they trickled. Bodies are now read whole on the
event loop with a time limit: the pages answer while the slow clients are still sending."""
from __future__ import annotations

import socket
import threading

import httpx

from collector_util import InProcessCollector

SLOW = 12


def _trickle(port: int, sent: list, index: int, ready: threading.Barrier, stop: threading.Event,
             answers: list) -> None:
    body = b'{"output": "runs-table.data"' + b" " * 400 + b"}"
    head = (f"POST /_dash-update-component HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head)
        for i, byte in enumerate(body):
            sock.sendall(bytes([byte]))
            sent[index] += 1
            if i == 2:
                ready.wait(60)          # every slow client is in the middle of its body
            if stop.wait(0.05) and i > 2:
                sock.sendall(body[i + 1:])
                break
        answers[index] = sock.recv(4096)[:12]


def test_twelve_slow_dashboard_bodies_do_not_stop_the_pages_answering(tmp_path):
    with InProcessCollector(tmp_path / "d.duckdb", dashboard=True) as srv, \
            httpx.Client(base_url=srv.url, timeout=60) as http:
        deps = http.get("/_dash-dependencies").json()
        table = next(d for d in deps if d["output"] == "runs-table.data")
        call = {"output": "runs-table.data", "outputs": {"id": "runs-table", "property": "data"},
                "inputs": [{"id": i["id"], "property": i["property"], "value": 1} for i in table["inputs"]],
                "changedPropIds": [], "state": []}
        sent, answers = [0] * SLOW, [None] * SLOW
        ready, stop = threading.Barrier(SLOW + 1), threading.Event()
        threads = [threading.Thread(target=_trickle, args=(srv.port, sent, i, ready, stop, answers), daemon=True)
                   for i in range(SLOW)]
        for t in threads:
            t.start()
        ready.wait(60)
        try:
            page = http.get("/")
            callback = http.post("/_dash-update-component", json=call)
            still_sending = sum(1 for t in threads if t.is_alive())
        finally:
            stop.set()
        for t in threads:
            t.join(60)
        assert page.status_code == 200 and "_dash-config" in page.text, page.text[:300]
        assert callback.status_code == 200, callback.text[:300]
        assert still_sending == SLOW, "GET / and the callback answered only once the slow clients had finished: they froze the dashboard"
        # the slow clients' bodies were read whole and judged: a 400 (not a callback of this page)
        assert all(a is not None and a.startswith(b"HTTP/1.1 4") for a in answers), answers
