"""The lake's settings in one validated object (`forksight serve --lake-*`): the catalog URI and options are
secrets (pydantic SecretStr: never in a repr, a log or an error), shown only through `shown()`, which
redacts the URI's password and every secret-named option; `open_catalog()` opens the catalog from them."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from forksight.monitor.lake.errors import LakeError

DEFAULT_COMMIT_ROWS = 500_000     # rows per commit: files of tens of MB, few snapshots
DEFAULT_COMMIT_SECONDS = 30.0     # ... or whatever waited this long
DEFAULT_CALL_DEADLINE_S = 60.0    # one catalog call (a commit included) past this is abandoned


FLAGS = {"catalog": "--lake-catalog", "warehouse": "--lake-warehouse", "options": "--lake-option",
         "collector_id": "--collector-id", "commit_rows": "--lake-commit-rows",
         "commit_seconds": "--lake-commit-seconds", "call_deadline_s": "--lake-call-deadline"}
_PLAIN = ("commit_rows", "commit_seconds", "call_deadline_s")      # numbers: shown as given


def _said(error: dict) -> str:
    """One validation error as the flag it came from, what it must be and (a number only) what was given."""
    field = str(error["loc"][0]) if error["loc"] else ""
    flag = FLAGS.get(field, field)
    if error["type"] == "value_error":
        return str(error["ctx"]["error"])
    what = error["msg"].replace("Input should be", "must be")
    given = f" (got {error['input']!r})" if field in _PLAIN else ""
    return f"{flag} {what}{given}"


class LakeSettings(BaseModel):
    """Where the lake is, who writes it, how often; a secret is never shown (see shown())."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    catalog: SecretStr = Field(description="the catalog: a SQLAlchemy URL or an Iceberg REST URL")
    warehouse: str = Field(description="where the lake's files go: a directory, s3://... or gs://...")
    options: dict[str, SecretStr] = Field(default_factory=dict, description="more catalog/FileIO properties")
    collector_id: str | None = Field(None, description="this collector's name in the lake")
    commit_rows: int = Field(DEFAULT_COMMIT_ROWS, ge=1, description="commit a table once this many rows wait")
    commit_seconds: float = Field(DEFAULT_COMMIT_SECONDS, gt=0, description="... or once they are this old")
    call_deadline_s: float = Field(DEFAULT_CALL_DEADLINE_S, gt=0,
                                   description="a catalog call that takes longer is abandoned and retried")

    @field_validator("collector_id")
    @classmethod
    def _collector(cls, value: str | None) -> str | None:
        from forksight.monitor.lake.outbox import COLLECTOR_ID_RE

        if value is not None and not COLLECTOR_ID_RE.match(value):
            raise ValueError(f"--collector-id {value!r}: use 1-64 letters, digits, . _ - (starting with a letter "
                             "or digit), e.g. the host's name")
        return value

    @classmethod
    def of(cls, **fields) -> "LakeSettings":
        """Validated settings, or a LakeError naming each bad field (never its value)."""
        from pydantic import ValidationError

        try:
            return cls(**{k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            raise LakeError("; ".join(_said(e) for e in exc.errors())) from None

    def uri(self) -> str:
        return self.catalog.get_secret_value()

    def properties(self) -> dict[str, str]:
        return {k: v.get_secret_value() for k, v in self.options.items()}

    def shown(self) -> dict:
        """What may be printed, logged and served: the URI without its password, secret options as ***."""
        from forksight.monitor.lake.catalog import redact, redact_options

        return {"catalog": redact(self.uri()), "warehouse": self.warehouse,
                "options": redact_options(self.properties()), "collector_id": self.collector_id,
                "commit_rows": self.commit_rows, "commit_seconds": self.commit_seconds,
                "call_deadline_s": self.call_deadline_s}

    def scrub(self, text: str) -> str:
        """`text` (a driver's or catalog's message) with the URI's password and every secret option's value as ***."""
        from urllib.parse import urlparse

        from forksight.monitor.lake.catalog import redact_options

        props = self.properties()
        secrets = [props[k] for k, shown in redact_options(props).items() if shown == "***"]
        secrets.append(urlparse(self.uri()).password or "")
        for secret in sorted(filter(None, secrets), key=len, reverse=True):    # a longer one may hold a shorter
            text = text.replace(secret, "***")
        return text

    def __repr__(self) -> str:
        return f"LakeSettings({self.shown()})"

    __str__ = __repr__

    def open_catalog(self, check: bool = True):
        """The catalog, reached and checked now (check); LakeError says why not, with no secret in it."""
        from forksight.monitor.lake.catalog import open_catalog

        return open_catalog(self.uri(), self.warehouse, check=check, properties=self.properties())
