"""Opening the lake's catalog from `--lake-catalog URI --lake-warehouse LOCATION`: a SQLAlchemy URL
is pyiceberg's SQL catalog (PostgreSQL, or SQLite on one box), http(s) an Iceberg REST catalog.
Every way this fails is a LakeError saying what and how to fix it."""
from __future__ import annotations

import os
from urllib.parse import urlparse

from forksight.monitor.lake.errors import LakeError
from forksight.monitor.lake.schema import LAKE_TABLES, NAMESPACE, ensure_table

CATALOG_NAME = "forksight"
CONNECT_TIMEOUT_S = 5
EXAMPLES = "e.g. postgresql+psycopg2://user:password@host:5432/db, sqlite:////var/lib/forksight/catalog.db " \
           "or https://iceberg-rest.example.com"
# a property whose name holds one of these is a secret: pyiceberg's REST `credential` (client_id:secret),
# `token`, auth.* and header.Authorization, every FileIO's *secret*/*key*/*token* (s3, gcs, adls sas)
SECRET_WORDS = ("secret", "password", "token", "key", "credential", "auth", "sas", "signature", "private")
NOT_SECRET = ("access-key-id",)      # names who signs, like a user name: shown so a wrong one can be seen


def redact(uri: str) -> str:
    """The URI without its password, for messages and /api/health."""
    parsed = urlparse(uri)
    if parsed.password:
        return uri.replace(f":{parsed.password}@", ":***@", 1)
    return uri


def redact_options(properties: dict[str, str] | None) -> dict[str, str]:
    """`--lake-option` properties for messages and logs: a value whose key names a secret is ***."""
    def secret(key: str) -> bool:
        key = key.lower()
        return any(w in key for w in SECRET_WORDS) and not key.endswith(NOT_SECRET)
    return {k: "***" if secret(k) and v else v for k, v in (properties or {}).items()}


def _scrub(text: str, properties: dict[str, str] | None) -> str:
    """`text` with every secret option's value replaced (a driver's message may quote it)."""
    for key, shown in redact_options(properties).items():
        if shown == "***":
            text = text.replace(properties[key], "***")
    return text


def warehouse_location(location: str) -> str:
    """A plain directory becomes an absolute file:// location (created); URLs pass unchanged."""
    if not location or not location.strip():
        raise LakeError("--lake-warehouse is empty: give a directory or an object-store URL (s3://bucket/path)")
    if "://" in location:
        return location
    path = os.path.abspath(location)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise LakeError(f"cannot create the lake warehouse directory {path}: {exc.strerror}; give a writable "
                        "--lake-warehouse") from None
    return "file://" + path


def open_catalog(uri: str, warehouse: str, *, check: bool = True, properties: dict[str, str] | None = None):
    """The catalog for `uri`; check: reach it now (create the namespace and the six tables, evolve their
    schemas), so a wrong URI or an incompatible lake is refused at start. properties: more catalog
    properties (`--lake-option`), e.g. the FileIO's s3.endpoint and keys."""
    try:
        import pyiceberg  # noqa: F401
    except ImportError:
        raise LakeError("the lake needs pyiceberg: pip install 'forksight[lake]'") from None
    try:         # the tables' partition transform (truncate) runs in it: without it every commit fails
        import pyiceberg_core  # noqa: F401
    except ImportError:
        raise LakeError("the lake needs pyiceberg-core (its partition transforms; without it no commit can "
                        "land): pip install 'forksight[lake]'") from None
    extra = dict(properties or {})
    scheme = urlparse(uri).scheme.lower() if uri else ""
    rest = scheme in ("http", "https")
    # a REST catalog's warehouse is the server's to resolve (often a name, e.g. `prod`): passed as given
    location = warehouse.strip() if rest and warehouse else warehouse_location(warehouse)
    try:
        if rest:
            from forksight.monitor.lake.rest import TimedRestCatalog

            catalog = TimedRestCatalog(CATALOG_NAME, **{**extra, "uri": uri, "warehouse": location})
        elif scheme.startswith(("postgresql", "sqlite", "mysql")):
            from pyiceberg.catalog.sql import SqlCatalog
            from sqlalchemy.engine import make_url

            url = make_url(uri)       # a malformed URL: ArgumentError, said below
            if url.get_backend_name() == "postgresql" and "connect_timeout" not in url.query:
                # an unreachable host: an error in seconds, not the TCP timeout's minutes
                url = url.update_query_dict({"connect_timeout": str(CONNECT_TIMEOUT_S)})
            # pre-ping: a pooled connection PostgreSQL dropped (a restart) is replaced, not an error
            catalog = SqlCatalog(CATALOG_NAME, **{"pool_pre_ping": "true", **extra,
                                                  "uri": url.render_as_string(hide_password=False),
                                                  "warehouse": location})
        else:
            raise LakeError(f"--lake-catalog {redact(uri)!r}: not a catalog URI (scheme {scheme or 'missing'!r}); "
                            f"give a SQLAlchemy URL or an Iceberg REST URL, {EXAMPLES}")
        if check:
            catalog.create_namespace_if_not_exists(NAMESPACE)
            for spec in LAKE_TABLES.values():
                ensure_table(catalog, spec)
    except LakeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every driver's failure (refused, unknown host, bad URL) said once
        detail = _scrub(" ".join(str(exc).split()), extra)[:300]
        options = f" and options {redact_options(extra)}" if extra else ""
        raise LakeError(f"cannot use the lake catalog {redact(uri)} with warehouse {location}{options} "
                        f"({type(exc).__name__}: {detail}); check the catalog is running and reachable and the "
                        f"URI is right, {EXAMPLES}") from None
    return catalog
