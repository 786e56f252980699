"""The Dash app factory: `create_dash(reader)`; `forksight serve` mounts `.server` at `/`.
Each page registers its callbacks on the app it is given and the reader and caches live on
that app's server (dashboard/data.py): two apps in one process never share callbacks or data."""
from __future__ import annotations

import importlib
from pathlib import Path

import dash
from dash import Dash, dcc, html

from forksight.base.interfaces import Reader
from forksight.dashboard import data

PAGES = ("forksight.dashboard.pages.runs", "forksight.dashboard.pages.run",
         "forksight.dashboard.pages.tokens", "forksight.dashboard.pages.compare",
         "forksight.dashboard.pages.alerts")
NAV = (("Runs", "/"), ("Run", "/run"), ("Tokens", "/tokens"), ("Compare", "/compare"),
       ("Alerts", "/alerts"))


def create_dash(reader: Reader, *, url_base: str = "/") -> Dash:
    """The dashboard reading only through `reader`; its Flask app is `.server`."""
    if not (url_base.startswith("/") and url_base.endswith("/")):
        raise ValueError(f"url_base must start and end with '/', got {url_base!r}")
    here = Path(__file__).parent
    app = Dash(__name__, use_pages=True, pages_folder="", url_base_pathname=url_base,
               assets_folder=str(here / "assets"), title="forksight", update_title=None,
               suppress_callback_exceptions=True)
    data.install(app.server, reader)     # on this app's server: never shared with another app
    for name in PAGES:
        importlib.import_module(name).register(app)
    app.layout = html.Div(className="shell", children=[
        dcc.Location(id="nav-location", refresh="callback-nav"),
        html.Header(className="topbar", children=[
            html.Span("forksight", className="brand"),
            html.Nav([dcc.Link(label, href=dash.get_relative_path(path), className="navlink")
                      for label, path in NAV]),
            html.Span("token-level RLVR diagnostics", className="tagline"),
        ]),
        html.Main(dash.page_container, className="content"),
    ])
    return app
