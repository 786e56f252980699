"""pyiceberg's REST catalog with timeouts: its HTTP session sets none, so a catalog host that drops
packets would hold `forksight serve` (and each commit) for the TCP timeout's minutes."""
from __future__ import annotations

from pyiceberg.catalog.rest import RestCatalog

CONNECT_TIMEOUT_S = 5.0  # an unreachable host: an error in seconds (as the SQL catalog's connect_timeout)
READ_TIMEOUT_S = 120.0   # a REST call's answer: a commit on a loaded catalog can take a while


class TimedRestCatalog(RestCatalog):
    """RestCatalog whose every request has (connect, read) timeouts unless the call gives its own."""

    def _create_session(self):
        session = super()._create_session()
        request = session.request

        def timed(method, url, **kwargs):
            kwargs.setdefault("timeout", (CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
            return request(method, url, **kwargs)
        session.request = timed
        return session
