"""The `[[notify]]` table: one target per table (a webhook or an exec hook). Part of the one
settings model (`supervisor.config.settings.Settings.notify`); secrets stay in files, read at start."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EventKind = Literal["incident", "failed", "recovered", "stayed_stopped", "launch_blocked"]
EVENT_KINDS: tuple[EventKind, ...] = ("incident", "failed", "recovered", "stayed_stopped", "launch_blocked")
# PagerDuty is for paging: an operator's stop that outlived a daemon restart pages nobody.
PAGERDUTY_EVENTS: tuple[EventKind, ...] = ("incident", "failed", "recovered", "launch_blocked")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


class NotifyTarget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: Literal["webhook", "exec"] = "webhook"
    format: Literal["json", "slack", "pagerduty"] = "json"  # the webhook body's shape
    url: str | None = None  # a URL without secrets; one with a token in it belongs in url_file
    url_file: str | None = None
    routing_key_file: str | None = None  # PagerDuty's integration key
    argv: tuple[str, ...] = ()  # exec: the hook's command line; the event arrives on stdin and in env
    events: tuple[EventKind, ...] | None = None  # None: all (PagerDuty: all but stayed_stopped)
    timeout_s: Annotated[float, Field(gt=0, le=300)] = 10.0
    retries: Annotated[int, Field(ge=0, le=20)] = 3
    backoff_initial_s: Annotated[float, Field(ge=0, le=3600)] = 2.0
    backoff_max_s: Annotated[float, Field(ge=0, le=3600)] = 60.0
    queue_size: Annotated[int, Field(ge=1, le=10000)] = 100

    @field_validator("argv", "events", mode="before")
    @classmethod
    def _as_tuple(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v

    @model_validator(mode="after")
    def _consistent(self) -> NotifyTarget:
        if self.kind == "exec":
            if not self.argv or not self.argv[0]:
                raise ValueError(f"notify {self.name!r}: an exec hook needs argv, e.g. ['/usr/local/bin/page-me']")
            if self.url or self.url_file or self.routing_key_file:
                raise ValueError(f"notify {self.name!r}: an exec hook takes argv, not url/url_file/routing_key_file")
        else:
            if self.argv:
                raise ValueError(f"notify {self.name!r}: argv is for kind = 'exec'")
            if self.url and self.url_file:
                raise ValueError(f"notify {self.name!r}: give url or url_file, not both")
            if self.format == "pagerduty":
                if not self.routing_key_file:
                    raise ValueError(f"notify {self.name!r}: a pagerduty target needs routing_key_file")
            elif self.routing_key_file:
                raise ValueError(f"notify {self.name!r}: routing_key_file is for format = 'pagerduty'")
            elif not self.url and not self.url_file:
                raise ValueError(f"notify {self.name!r}: a webhook needs url or url_file")
            if self.url is not None and not self.url.startswith(("http://", "https://")):
                raise ValueError(f"notify {self.name!r}: url must start with http:// or https://")
        if self.format == "pagerduty" and self.events is not None:
            extra = set(self.events) - set(PAGERDUTY_EVENTS)
            if extra:
                raise ValueError(f"notify {self.name!r}: pagerduty takes only {', '.join(PAGERDUTY_EVENTS)}")
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"notify {self.name!r}: backoff_max_s must be >= backoff_initial_s")
        return self

    @property
    def wanted(self) -> tuple[EventKind, ...]:
        if self.events is not None:
            return self.events
        return PAGERDUTY_EVENTS if self.format == "pagerduty" and self.kind == "webhook" else EVENT_KINDS


def unique_names(targets: tuple[NotifyTarget, ...]) -> tuple[NotifyTarget, ...]:
    seen: set[str] = set()
    for t in targets:
        if t.name in seen:
            raise ValueError(f"two [[notify]] targets are named {t.name!r}")
        seen.add(t.name)
    return targets
