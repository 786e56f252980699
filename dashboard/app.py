"""The Dash app factory: `create_dash(reader)`; `forksight serve` mounts `.server` at `/`.
Each page registers its callbacks on the app it is given and the reader and caches live on
that app's server (dashboard/data.py): two apps in one process never share callbacks or data."""
from __future__ import annotations

import copy
import importlib
import logging
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import dash
import flask
from dash import Dash, dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard import data

log = logging.getLogger("forksight.dashboard")

PAGES = ("forksight.dashboard.pages.runs", "forksight.dashboard.pages.run",
         "forksight.dashboard.pages.tokens", "forksight.dashboard.pages.reference",
         "forksight.dashboard.pages.compare", "forksight.dashboard.pages.alerts")
ASSET_MAX_AGE_S = 365 * 24 * 3600
# The trace types the figures draw: assets/plotly-forksight.min.js registers these only (1.5 MB,
# Dash's full plotly.js is 4.8 MB and cost ~1.5 s of browser work per first open). Dash uses a
# window.Plotly an asset defines. A new type: add it to plotly_bundle/entry.js and rebuild.
PLOTLY_TRACES = ("scatter", "scattergl", "heatmap")
# The layout (the opened page, drawn) and the callback graph are fetched by Dash's renderer only
# once every script has run (~1 s on a first open); preloaded, the collector builds them meanwhile
# and the renderer's own fetch takes the preloaded answer (same URL, mode and credentials).
PRELOAD = ('<link rel="preload" href="{prefix}_dash-layout" as="fetch" crossorigin="anonymous">'
           '<link rel="preload" href="{prefix}_dash-dependencies" as="fetch" crossorigin="anonymous">')
NAV = (("Runs", "/"), ("Run", "/run"), ("Tokens", "/tokens"), ("Reference", "/reference"), ("Compare", "/compare"),
       ("Alerts", "/alerts"))


def create_dash(reader: Reader, *, url_base: str = "/", fork_rule: str | None = None) -> Dash:
    """The dashboard reading only through `reader`; its Flask app is `.server`. fork_rule: the rule the tokens
    page outlines forks by for every run (abs:τ or top:q; None: each run's stored flags)."""
    from forksight.base.fork_rule import ForkRule

    rule = None if fork_rule is None else ForkRule.parse(fork_rule)       # a bad rule: said before serving
    if not (url_base.startswith("/") and url_base.endswith("/")):
        raise ValueError(f"url_base must start and end with '/', got {url_base!r}")
    here = Path(__file__).parent
    app = Dash(__name__, use_pages=True, pages_folder="", url_base_pathname=url_base,
               assets_folder=str(here / "assets"), title="forksight", update_title=None,
               suppress_callback_exceptions=True)
    data.install(app.server, reader, rule)     # on this app's server: never shared with another app
    # assets (/assets/style.css?m=<mtime>) carry their file's time in the URL: a browser may keep
    # them a year (Dash's fingerprinted component scripts are cached so already)
    app.server.config["SEND_FILE_MAX_AGE_DEFAULT"] = ASSET_MAX_AGE_S
    for name in PAGES:
        importlib.import_module(name).register(app)
    app.layout = shell
    prefix = app.config.requests_pathname_prefix
    app.index_string = app.index_string.replace("{%css%}", PRELOAD.format(prefix=prefix) + "{%css%}", 1)
    return app


def shell() -> html.Div:
    """The page frame, holding the opened page already (see opened_page)."""
    return html.Div(className="shell", children=[
        dcc.Location(id="nav-location", refresh="callback-nav"),
        html.Header(className="topbar", children=[
            html.Span("forksight", className="brand"),
            html.Nav([dcc.Link(label, href=dash.get_relative_path(path), className="navlink")
                      for label, path in NAV]),
            html.Span("token-level RLVR diagnostics", className="tagline"),
        ]),
        html.Main(opened_page(), className="content"),
    ])


def opened_page():
    """Dash's page container with the page the browser opened already in it. Dash pages leave
    the container empty and fill it by a callback once its Location reports the URL: one more
    round trip, before any of the page's own, on every first open. The layout request comes
    from the opened page, whose URL is its Referer; the Location is given that URL, so it
    reports no change and Dash's router stays quiet until the user navigates. Without a usable
    Referer (or if the page fails here) the container is left to the router, as Dash does."""
    container = copy.deepcopy(dash.page_container)
    url = _opened_url()
    page = _page_at(urlsplit(url).path) if url else None
    if page is None:
        return container
    location = next(c for c in container.children if isinstance(c, dcc.Location))
    store = next(c for c in container.children if isinstance(c, dcc.Store))
    content = next(c for c in container.children if isinstance(c, html.Div))
    parts = urlsplit(url)
    query = {k: v[0] if len(v) == 1 else v
             for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    try:
        layout = page["layout"]
        content.children = layout(**query) if callable(layout) else layout
    except Exception:  # noqa: BLE001 - the router shows this page (and its error) instead
        log.exception("forksight: the page %s could not be built with the layout; left to the router", url)
        return copy.deepcopy(dash.page_container)
    location.pathname, location.search, location.hash = parts.path, \
        f"?{parts.query}" if parts.query else "", ""
    location.href = url
    store.data = {"title": page["title"]}
    return container


def _opened_url() -> str | None:
    """The URL of the page asking for the layout (its Referer, same origin only), else None."""
    if not flask.has_request_context() or not flask.request.path.endswith("/_dash-layout"):
        return None
    referrer = flask.request.referrer
    if not referrer:
        return None
    parts = urlsplit(referrer)
    if parts.netloc != flask.request.host or parts.fragment:
        return None
    return referrer


def _page_at(path: str) -> dict | None:
    """The registered page at this URL path (Dash's registry), or None (the router's 404)."""
    wanted = "/" + dash.strip_relative_path(path) if path else "/"
    return next((p for p in dash.page_registry.values() if p.get("path") == wanted), None)
