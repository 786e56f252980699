"""`forksight serve` (the collector + dashboard) and `forksight export` (Parquet for a data lake)."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading

from forksight.compose.lake_cli import add_lake_option

SAY_VERIFY_BYTES = 1 << 30      # from this size on, serve says it is checking the file (seconds)
DEMO_DB = "forksight-demo.duckdb"  # `forksight demo`'s default file


def add_parser(subparsers) -> None:
    """Register `serve` and `export`."""
    serve = subparsers.add_parser("serve", help="run the collector and dashboard on one DuckDB file",
                                  description="Run the collector (FastAPI) and the dashboard in one process "
                                  "that owns the DuckDB file. Binding anything but loopback needs a token.")
    serve.add_argument("--db", default="forksight.duckdb", help="DuckDB file (created if missing)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    serve.add_argument("--port", type=int, default=8050)
    serve.add_argument("--token", default=None,
                       help="require 'Authorization: Bearer TOKEN' on every request (default $FORKSIGHT_TOKEN)")
    serve.add_argument("--no-dashboard", action="store_true", help="serve the API only")
    serve.add_argument("--words-per-step", type=int, default=None, metavar="N",
                       help="token strings the words aggregate keeps per step, by count and by fork share "
                            "(default 100)")
    serve.add_argument("--fork-rule", default=None, metavar="RULE",
                       help="outline forks on the tokens page under this rule for every run, from the stored H "
                            "(abs:τ or top:q; default: each run's stored flags, its own rule)")
    serve.add_argument("--skip-verify", action="store_true",
                       help="start without reading every block of the file first (about 25 ms per million "
                       "rows); a damaged block is then found when a read reaches it, not at start")
    serve.add_argument("--memory-limit", metavar="SIZE", default=None,
                       help="cap DuckDB's memory in the collector, e.g. 2GB (default DuckDB's own: 80%% of RAM); "
                       "larger queries spill to disk")
    serve.add_argument("--threads", type=int, default=None,
                       help="DuckDB worker threads (default: every core); fewer leaves cores to a training job")
    serve.add_argument("--alerts-config", metavar="FILE", default=None,
                       help="YAML/JSON alert thresholds (default $FORKSIGHT_ALERTS_CONFIG; see "
                       "`forksight alerts replay` to tune them on a stored run)")
    serve.add_argument("--alert", metavar="SECTION.FIELD=VALUE", action="append", default=[],
                       help="override one alert setting, e.g. --alert collapse.floor=0.1 (repeatable)")
    serve.add_argument("--webhook", metavar="URL", default=None,
                       help="post every alert to this Slack-compatible webhook (default $FORKSIGHT_WEBHOOK_URL)")
    lake = serve.add_argument_group("lake", "also commit every row to an Apache Iceberg lake (docs/lake.md; "
                                    "needs pip install 'forksight[lake]')")
    lake.add_argument("--lake-catalog", metavar="URI", default=None,
                      help="the lake's catalog: a SQLAlchemy URL (postgresql+psycopg2://user:pw@host/db, "
                      "sqlite:///catalog.db) or an Iceberg REST URL (https://...)")
    lake.add_argument("--lake-warehouse", metavar="LOCATION", default=None,
                      help="where the lake's files go: a directory, s3://... or gs://...")
    add_lake_option(lake)
    lake.add_argument("--lake-commit-rows", type=int, default=None, metavar="N",
                      help="commit a table once this many rows wait (default 500000)")
    lake.add_argument("--lake-commit-seconds", type=float, default=None, metavar="S",
                      help="... or once its oldest waiting rows are this old (default 30)")
    lake.add_argument("--lake-call-deadline", type=float, default=None, metavar="S",
                      help="a catalog call (a commit) that takes longer is abandoned and retried, and "
                      "/api/health/lake says 'stalled' (default 60)")
    lake.add_argument("--collector-id", default=None, metavar="ID",
                      help="this collector's name in the lake (default: stored in the DuckDB file, first "
                      "made from the host name); unique per collector writing one lake")
    serve.set_defaults(func=run_serve)

    export = subparsers.add_parser("export", help="write a run as hive-partitioned Parquet",
                                   description="Write one run's tables to DIR/<table>/run_id=<id>/*.parquet; "
                                   "read back with read_parquet('DIR/<table>/**/*.parquet', hive_partitioning=true).")
    export.add_argument("--db", required=True, help="DuckDB file (not held by a running collector)")
    export.add_argument("--run", required=True, help="run id")
    export.add_argument("--out", required=True, help="output directory")
    export.set_defaults(func=run_export)


def run_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from forksight.compose.app import SERVER_OPTIONS, create_app
    from forksight.compose.stack import CollectorParts
    from forksight.monitor.collector.guard import check_bind
    from forksight.monitor.collector.dbfile import duckdb_config

    from forksight.base.env import token_or_env

    token = token_or_env(args.token)
    try:
        check_bind(args.host, token)
    except ValueError as exc:
        print(f"forksight serve: {exc}", file=sys.stderr)
        return 2
    try:
        hub = _alert_hub(args)
        duckdb_config(args.memory_limit, args.threads)      # every setting is checked before the file
        if args.words_per_step is not None and args.words_per_step < 1:
            raise ValueError(f"--words-per-step must be >= 1, got {args.words_per_step}")
        if args.fork_rule is not None:
            from forksight.base.fork_rule import ForkRule

            args.fork_rule = str(ForkRule.parse(args.fork_rule))
    except (ValueError, FileNotFoundError) as exc:
        print(f"forksight serve: {exc}", file=sys.stderr)
        return 2
    try:
        lake_settings, catalog = _lake_catalog(args)     # before the file: a wrong URI leaves nothing behind
    except RuntimeError as exc:
        print(f"forksight serve: {exc}", file=sys.stderr)
        return 2
    busy = port_in_use(args.host, args.port)
    if busy:                 # before the file: a refused start leaves nothing behind
        print(f"forksight serve: port {args.port} on {args.host or 'every interface'} is in use ({busy}); "
              f"is another `forksight serve` or demo running? Choose a free port with --port, "
              f"e.g. --port {args.port + 1}", file=sys.stderr)
        return 1
    existed = os.path.isfile(args.db)
    size = os.path.getsize(args.db) if existed else 0
    if size >= SAY_VERIFY_BYTES and not args.skip_verify:     # seconds of silence otherwise
        print(f"forksight serve: checking every block of {args.db} ({size / 2**30:.1f} GiB, about 25 ms "
              "per million rows) before serving; --skip-verify starts at once", file=sys.stderr, flush=True)
    from forksight.monitor.lake.errors import LakeError

    try:
        parts = CollectorParts(args.db, lake_settings=lake_settings, catalog=catalog, verify=not args.skip_verify,
                               memory_limit=args.memory_limit, threads=args.threads,
                               **({"words_per_step": args.words_per_step} if args.words_per_step else {}))
    except RuntimeError as exc:
        print(f"forksight serve: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, LakeError) else 1
    if parts.lake is not None:
        _say_lake(lake_settings, parts.lake)
    try:
        app = create_app(parts.store, token=token, dashboard=not args.no_dashboard, hub=hub, lake=parts.lake,
                         fork_rule=args.fork_rule)
    except BaseException:
        parts.close()
        raise
    where = f"http://{args.host}:{args.port}" if args.host.strip() else f"every interface, port {args.port}"
    print(f"forksight collector on {where} (db {os.path.abspath(args.db)}{'' if existed else ', new'}); "
          f"API docs at /docs{'; token required' if token else ''}", flush=True)
    hint = _other_db_hint(args.db, existed)
    if hint:
        print(hint, flush=True)
    # uvicorn handles SIGINT/SIGTERM itself, shuts down, then raises the signal again with the
    # handler that was set before it ran: for SIGTERM (docker stop, systemd, Kubernetes) Python's
    # default killed the process before store.close(). This handler makes SIGTERM what SIGINT is
    # (KeyboardInterrupt), so it ends exactly as Ctrl-C does: the store is closed (no .wal left),
    # close hooks run, exit 0 — also when it arrives before uvicorn has installed its own handlers
    # (a handler that did nothing there swallowed it, and the collector then ran on).
    previous = _stop_quietly_on_sigterm()
    try:
        uvicorn.run(app, host=args.host, port=args.port, **SERVER_OPTIONS)
    except KeyboardInterrupt:          # Ctrl-C, raised again by uvicorn once it has shut down
        pass
    finally:
        parts.close()            # the lake's last drain while the store still answers, then the store
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(f"forksight collector stopped; {args.db} closed", flush=True)
    return 0


def port_in_use(host: str, port: int) -> str | None:
    """Why (host, port) cannot be bound now, or None: bound the way uvicorn binds (SO_REUSEADDR),
    then released at once."""
    import socket

    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve {host!r}: {exc.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def _other_db_hint(db: str, existed: bool) -> str | None:
    """A new default file next to the demo's: say where the demo's runs are and how to open them."""
    if existed or os.path.basename(db) == DEMO_DB:
        return None
    demo = os.path.join(os.path.dirname(os.path.abspath(db)), DEMO_DB)
    if not os.path.isfile(demo):
        return None
    return (f"forksight serve: {db} is a new, empty file; the demo's runs are in {DEMO_DB}: "
            f"forksight serve --db {DEMO_DB}")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _stop_quietly_on_sigterm():
    """Install a SIGTERM handler that raises KeyboardInterrupt, as SIGINT's does (uvicorn's own
    replaces it while serving, and calls it again once shut down); returns the one it replaced
    (None off the main thread, where signals cannot be set)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _interrupt)


def _lake_catalog(args: argparse.Namespace):
    """(the lake's settings, its catalog reached and checked now), (None, None) without --lake-catalog;
    LakeError says why not, with no secret in it."""
    if args.lake_catalog is None:
        if args.lake_warehouse or args.lake_commit_rows is not None or args.lake_commit_seconds is not None \
                or args.collector_id or args.lake_option or args.lake_call_deadline is not None:
            raise RuntimeError("--lake-warehouse, --lake-option, --lake-commit-*, --lake-call-deadline and "
                               "--collector-id need --lake-catalog URI")
        return None, None
    if not args.lake_warehouse:
        raise RuntimeError("--lake-catalog needs --lake-warehouse LOCATION (a directory, s3://... or gs://...)")
    from forksight.monitor.lake.settings import LakeSettings

    settings = LakeSettings.of(catalog=args.lake_catalog, warehouse=args.lake_warehouse,
                               options=dict(args.lake_option), collector_id=args.collector_id,
                               commit_rows=args.lake_commit_rows, commit_seconds=args.lake_commit_seconds,
                               call_deadline_s=args.lake_call_deadline)
    return settings, settings.open_catalog()


def _say_lake(settings, lake) -> None:
    """The lake's start banner: what it commits to, its secrets redacted."""
    shown = settings.shown()
    options = f", options {shown['options']}" if shown["options"] else ""
    print(f"forksight lake: collector {lake.collector} commits to {shown['catalog']} ({settings.warehouse}"
          f"{options}; a catalog call past {settings.call_deadline_s:g} s is abandoned)", flush=True)


def _alert_hub(args: argparse.Namespace):
    """The collector's alert hub from --alerts-config/--alert/--webhook (None: the env defaults)."""
    if not (args.alerts_config or args.alert or args.webhook):
        return None
    from forksight.monitor.alerts.hub import ENV_CONFIG, AlertHub, load_alert_config

    config = load_alert_config(args.alerts_config or os.environ.get(ENV_CONFIG), args.alert)
    return AlertHub(config, webhook_url=args.webhook)


def run_export(args: argparse.Namespace) -> int:
    from forksight.monitor.collector.export import export_file

    try:
        written = export_file(args.db, args.run, args.out)
    except (RuntimeError, LookupError, FileNotFoundError, ValueError) as exc:
        print(f"forksight export: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"run_id": args.run, "out": args.out, "rows": written}))
    return 0
