"""`RunSpec`: what names and describes one run, built once at the door (`open_sink`, `forksight.attach`,
the TRL and verl integrations) and handed down whole to the sink that creates the run. Frozen and
validated by the collector's own rules (run id pattern, short-text and rank limits, the config rule),
so a bad value is refused in the training process, naming the field, before anything is sent."""
from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from forksight.base.limits import (MAX_RANK, MAX_SHORT_CHARS, RUN_ID_PATTERN, RUN_ID_RE, config_problem,
                                   slug_run_name)

log = logging.getLogger("forksight.client")


def _checked_config(value: dict | None) -> dict | None:
    if value is not None and (problem := config_problem(value)):
        raise ValueError(problem)
    return value


# a run's free-form config with the one rule every door applies (a lone surrogate or 200 levels of
# nesting once made GET /api/runs/{id} a 500): RunSpec here, POST/PATCH /api/runs in the collector
RunConfig = Annotated[dict[str, Any] | None, AfterValidator(_checked_config),
                      Field(description="free JSON, at most 256 KiB serialised")]

# what POST /api/runs (and Store.create_run) take from a spec; the rest is for the sink
_CREATE_FIELDS = ("name", "project", "strategy", "model", "config")


class RunSpec(BaseModel):
    """One run as the producer describes it. `name` becomes the run id unless taken (then name-2, ...);
    resume: continue the run whose id is exactly `name`; rank > 0 joins the live run of that name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field("run", pattern=RUN_ID_PATTERN, description="run name; the run id unless taken")
    project: str = Field("default", max_length=MAX_SHORT_CHARS)
    strategy: str | None = Field(None, max_length=MAX_SHORT_CHARS)
    model: str | None = Field(None, max_length=MAX_SHORT_CHARS)
    config: RunConfig = None
    rank: int = Field(0, ge=0, le=MAX_RANK, description="this process's rank; ranks > 0 join rank 0's run")
    stop_on_alert: bool = Field(False, description="a critical alert sets the sink's should_stop")
    resume: bool = Field(False, description="continue the run with id `name`, not a new `name-2`")
    token: str | None = Field(None, repr=False, description="bearer token (default: $FORKSIGHT_TOKEN)")

    @classmethod
    def of(cls, run: "str | RunSpec", **fields: Any) -> "RunSpec":
        """The door: a name (one that is not a valid run id, e.g. TRL's default run_name, an output
        dir path, becomes its nearest valid id, with a warning) or a spec, plus fields that replace
        the spec's (fields given as None are left out: the spec's value, or the default, stays)."""
        fields = {k: v for k, v in fields.items() if v is not None}
        if isinstance(run, RunSpec):
            return run.replace(**fields) if fields else run
        name = str(run)
        if not RUN_ID_RE.match(name):
            log.warning("forksight: run name %r is not a valid run id; using %r", name, slug_run_name(name))
            name = slug_run_name(name)
        return cls(name=name, **fields)

    def replace(self, **fields: Any) -> "RunSpec":
        """A copy with `fields` changed, validated like a new spec."""
        return type(self)(**{**self.model_dump(), **fields})

    def filled(self, **defaults: Any) -> "RunSpec":
        """A copy whose unset (None) fields take `defaults`, as an integration fills in what it knows
        (model, strategy); a default config goes under the spec's own (the spec's keys win)."""
        update = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        if defaults.get("config") is not None and self.config is not None:
            update["config"] = {**defaults["config"], **self.config}
        return self.replace(**update) if update else self

    def create_body(self) -> dict[str, Any]:
        """The run's fields as POST /api/runs takes them (unset ones left out)."""
        return {k: v for k in _CREATE_FIELDS if (v := getattr(self, k)) is not None}
