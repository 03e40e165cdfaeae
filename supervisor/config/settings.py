"""The one settings model: the TOML config, validated once at start and frozen.

Unknown keys, wrong types and impossible values are refused with the key's dotted path and what
was expected (`ConfigError`). Nothing here reads files or the environment at import time.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from supervisor.common.configerror import ConfigError as ConfigError  # raised here; the class lives in the leaf
from supervisor.config.alerting import NotifyTarget, unique_names
from supervisor.config.expand import ExpansionError, expand
from supervisor.config.fast import CachesSettings, LearnedSettings
from supervisor.config.gpu import GpuSettings
from supervisor.config.slate import SlateSettings
from supervisor.engines import Engine, profile_of
from supervisor.status.causes import CAUSES, HANG_CLASSES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib  # type: ignore[import-not-found,no-redef]

BASE_RUNG = "base"

ArgValue = Union[bool, int, float, str, list[Union[int, float, str]]]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServerSettings(_Section):
    # Which engine the base configuration runs; its profile (supervisor/engines) says what its lines,
    # titles, metrics and health mean. A rung may run another (`[[fallback]] engine`).
    engine: Engine = "sglang"
    command: tuple[str, ...] = ("python3", "-m", "sglang.launch_server")  # default: the engine's own
    host: str = "127.0.0.1"
    port: Port = 30000
    env: dict[str, str] = Field(default_factory=dict)
    args: dict[str, ArgValue] = Field(default_factory=dict)
    cwd: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _engine_command(cls, data: object) -> object:
        """No `command`: the engine's own (`python3 -m vllm.entrypoints.openai.api_server` for vLLM)."""
        if isinstance(data, dict) and "command" not in data and data.get("engine") in ("sglang", "vllm"):
            return {**data, "command": profile_of(data["engine"]).default_command}
        return data

    @field_validator("command", mode="before")
    @classmethod
    def _command_list(cls, v: object) -> object:
        return _as_command(v)

    @field_validator("command")
    @classmethod
    def _command_nonempty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _check_command(v)

    @field_validator("args")
    @classmethod
    def _no_host_port(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        _check_arg_names(v)
        return v


class Rung(_Section):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    args: dict[str, ArgValue] = Field(default_factory=dict)
    drop: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    on: tuple[str, ...] = ()
    # A rung of its own engine or program: its `args` then start from an empty set (not the base's),
    # and `command` defaults to that engine's own. Unset: the base configuration's.
    engine: Engine | None = None
    command: tuple[str, ...] | None = None

    @field_validator("drop", "on", mode="before")
    @classmethod
    def _as_tuple(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("command", mode="before")
    @classmethod
    def _command_list(cls, v: object) -> object:
        return _as_command(v)

    @field_validator("command")
    @classmethod
    def _command_nonempty(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if v is None else _check_command(v)

    @model_validator(mode="after")
    def _own_set(self) -> Rung:
        if self.drop and self.own_args:
            raise ValueError(
                "drop removes arguments of the base configuration, but a rung that sets engine or "
                "command starts from its own empty set: list only the args it runs with"
            )
        return self

    @property
    def own_args(self) -> bool:
        """The rung's args are all it runs with (it sets its own engine or program)."""
        return self.engine is not None or self.command is not None

    @field_validator("args")
    @classmethod
    def _arg_names(cls, v: dict[str, ArgValue]) -> dict[str, ArgValue]:
        _check_arg_names(v)
        return v

    @field_validator("on")
    @classmethod
    def _known_triggers(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for item in v:
            if item not in HANG_CLASSES and item not in CAUSES:
                raise ValueError(
                    f"unknown trigger {item!r}: expected a hang class ({', '.join(HANG_CLASSES)}) "
                    f"or a cause ({', '.join(CAUSES)})"
                )
        return v


class WatchdogSettings(_Section):
    poll_interval_s: PositiveFloat = 2.0
    # Start-up: progress on any channel resets the stall clock (docs/CONFIGURATION.md says why
    # these defaults fit an 8-GPU, ~600 GB model).
    startup_stall_s: PositiveFloat = 180.0
    startup_timeout_s: PositiveFloat = 3600.0
    cpu_only_stall_s: PositiveFloat = 900.0
    cpu_progress_cores: PositiveFloat = 0.3
    rss_progress_bytes: PositiveInt = 64 * 1024 * 1024
    read_progress_bytes_per_s: PositiveInt = 512 * 1024
    gpu_mem_progress_bytes: PositiveInt = 256 * 1024 * 1024
    # Ready: health and serving.
    health_path: str = Field(default="/health", pattern=r"^/[^\s]*$")
    health_interval_s: PositiveFloat = 10.0
    health_timeout_s: PositiveFloat = 30.0
    health_failures: PositiveInt = 3
    metrics_path: str = Field(default="/metrics", pattern=r"^/[^\s]*$")
    metrics_timeout_s: PositiveFloat = 5.0
    metrics_interval_s: PositiveFloat = 5.0  # SGLang refreshes its gauges every 40 decode steps anyway
    serving_stall_s: PositiveFloat = 60.0
    spec_accept_floor: NonNegFloat = 1.5
    spec_window_s: PositiveFloat = 120.0
    on_spec_regression: Literal["alert", "fallback"] = "alert"
    # Classification of a stall: busy when the tree burns this many cores or a GPU is this busy.
    busy_cpu_cores: PositiveFloat = 0.8
    busy_gpu_percent: PositiveFloat = 50.0
    # CPU that only waits on the GPU is not progress (docs/DECISIONS.md "Busy hangs at start-up"):
    # a GPU this busy (NVML) with GPM SM activity at or under this ratio is spinning, not working;
    # and this many py-spy looks in a row with every busy thread in a GPU wait say the same.
    gpm_spin_sm_active: Annotated[float, Field(ge=0, le=1)] = 0.02
    # Without GPM (issue 35): a GPU this busy drawing within this fraction of the way from its idle
    # power to its power limit is spinning; idle power is learned (lowest draw at util 0) unless set.
    power_spin_fraction: Annotated[float, Field(ge=0, le=1)] = 0.1
    gpu_idle_power_w: PositiveFloat | None = None
    # NCCL RAS as a detector (issue 35): polled at most this often (0: off); frozen differing counts
    # for ras_confirm_s are a collective hang, an unresponsive rank for as long is rank_died.
    ras_interval_s: NonNegFloat = 2.0
    ras_confirm_s: PositiveFloat = 6.0
    gpu_wait_samples: Annotated[int, Field(ge=1, le=20)] = 3
    busy_sample_timeout_s: PositiveFloat = 2.0

    @model_validator(mode="after")
    def _windows(self) -> WatchdogSettings:
        if self.startup_timeout_s < self.startup_stall_s:
            raise ValueError("startup_timeout_s must be >= startup_stall_s (it is only a backstop)")
        if self.cpu_only_stall_s < self.startup_stall_s:
            raise ValueError("cpu_only_stall_s must be >= startup_stall_s")
        if self.health_timeout_s < self.poll_interval_s / 2:
            raise ValueError("health_timeout_s is shorter than half a poll interval")
        if self.metrics_interval_s > self.serving_stall_s / 2:
            raise ValueError("metrics_interval_s must be at most half of serving_stall_s (two scrapes per window)")
        return self


class RestartSettings(_Section):
    retries_per_rung: Annotated[int, Field(ge=0)] = 1
    backoff_initial_s: NonNegFloat = 1.0  # doubling; 5 s before issue 36 (the daemon's share of an outage)
    backoff_max_s: NonNegFloat = 300.0
    backoff_jitter: Annotated[float, Field(ge=0, le=1)] = 0.1
    max_restarts_per_hour: PositiveInt = 10
    stop_grace_s: NonNegFloat = 30.0
    # A tree judged hung (its evidence already captured) gets this grace instead: a deadlocked server
    # cannot shut down gracefully, and real SGLang's main process sat out every SIGTERM grace
    # (docs/REAL_SGLANG.md), which made the stop the longest part of the daemon's share (issue 36).
    hung_stop_grace_s: NonNegFloat = 1.0
    release_timeout_s: NonNegFloat = 60.0
    release_policy: Literal["relaunch", "fail"] = "relaunch"
    stable_s: PositiveFloat = 600.0
    start_from: Literal["last_good", "preferred"] = "last_good"
    promote_after_s: NonNegFloat = 0.0  # 0 = never try the preferred rung again by itself
    # After the ladder or the hourly budget is spent: wait this long in `failed`, then start again
    # from the preferred rung with fresh counters. Minutes: long enough for a transient cause (a
    # neighbour holding the GPU, a storage hiccup) to clear, short against an unattended night.
    failed_cooldown_s: NonNegFloat = 600.0  # 0 = stay failed until an operator acts
    # Where SGLang puts its POSIX shared memory; stale segments there are removed before each
    # launch (supervisor/daemon/cleanslate.py). "" turns the sweep off.
    shm_dir: str = "/dev/shm"

    @model_validator(mode="after")
    def _backoff(self) -> RestartSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self


class DiagnosticsSettings(_Section):
    py_spy: bool = True
    native: bool = True
    gdb: Literal["never", "on_hang", "always"] = "on_hang"
    keep: PositiveInt = 20
    max_mb: PositiveFloat = 500.0
    py_spy_timeout_s: PositiveFloat = 20.0
    gdb_timeout_s: PositiveFloat = 30.0
    log_tail_lines: PositiveInt = 500
    py_spy_path: str | None = None
    gdb_path: str | None = None
    # NCCL Flight Recorder (issue 35): the ranks launch with its buffer and pipe unless the operator
    # set them; a hang's capture writes the pipes and waits up to flight_recorder_wait_s for dumps.
    flight_recorder: bool = True
    flight_recorder_entries: Annotated[int, Field(ge=1, le=1_000_000)] = 2000
    flight_recorder_wait_s: Annotated[float, Field(gt=0, le=60)] = 5.0


_HOST_NAME = re.compile(r"\*|[A-Za-z0-9_.-]+|\[?[0-9A-Fa-f:.]+\]?")


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: Port = 8900
    token_file: str | None = None
    token_env: str = "SGLANG_SUPERVISOR_TOKEN"
    max_body_bytes: PositiveInt = 64 * 1024
    # Host names the API answers to beyond the defaults (api/browser.py: loopback names on a loopback
    # bind; IP literals and this machine's names otherwise); "*" turns the Host check off.
    allowed_hosts: tuple[str, ...] = ()

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _hosts_tuple(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not _HOST_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a host name, an IP address or '*' (no scheme, port or path)")
        return v


class LogsSettings(_Section):
    max_file_mb: PositiveFloat = 100.0
    backups: Annotated[int, Field(ge=0, le=100)] = 5
    memory_lines: Annotated[int, Field(ge=100, le=1_000_000)] = 5000
    journal: bool = False  # also send the server's output to the systemd journal (it is large)
    journal_identifier: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")] = "sglang"
    journal_socket: str = "/run/systemd/journal/socket"


class PathsSettings(_Section):
    state_dir: str = "/var/lib/sglang-supervisor"
    cache_dir: str | None = None  # kernel caches (issue 36); None: <state_dir>/cache, never under $TMPDIR


_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


class GroupSettings(_Section):
    """[group]: one daemon per node of a multi-node server (supervisor/group, docs/MULTINODE.md)."""

    nnodes: Annotated[int, Field(ge=2)]
    node_rank: Annotated[int, Field(ge=0)]
    leader: str | None = None  # node 0's daemon API, host:port (workers report to it)
    members: tuple[str, ...] = ()  # nodes 1..nnodes-1's daemon APIs, host:port, in rank order
    restart: Literal["daemon", "lws"] = "daemon"
    request_timeout_s: PositiveFloat = 3.0  # one request to a member's API
    unreachable_s: PositiveFloat = 10.0  # a member unanswered this long is named in `degraded`
    # Peer identity (supervisor/group/signing.py): the group secret (mode 0600; every node's key is
    # derived from it), or on a worker only its own key (`sglang-supervisor group-key`).
    secret_file: str | None = None
    key_file: str | None = None
    max_skew_s: PositiveFloat = 30.0  # a signed request or answer older or newer than this is refused
    # A stall explained by a node that cannot be asked (away, late, partitioned) waits this long for
    # it before the group's incident goes ahead (naming it, on the same rung: no ladder step).
    absent_wait_s: PositiveFloat = 600.0
    absent_alert_s: PositiveFloat = 300.0  # a member away this long: `group_node_absent` (warning), once

    @field_validator("members", mode="before")
    @classmethod
    def _members_tuple(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("leader")
    @classmethod
    def _leader_address(cls, v: str | None) -> str | None:
        if v is not None:
            _check_address(v)
        return v

    @field_validator("members")
    @classmethod
    def _member_addresses(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for a in v:
            _check_address(a)
        return v

    @model_validator(mode="after")
    def _shape(self) -> GroupSettings:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} is not below nnodes {self.nnodes} (ranks are 0..nnodes-1)")
        if self.node_rank == 0 and len(self.members) != self.nnodes - 1:
            raise ValueError(
                f"the leader (node_rank 0) needs members = the {self.nnodes - 1} other nodes' daemon API "
                f"addresses in rank order (got {len(self.members)})"
            )
        if self.node_rank > 0 and self.leader is None:
            raise ValueError("a worker (node_rank >= 1) needs leader = node 0's daemon API address, host:port")
        if self.node_rank == 0 and self.key_file is not None:
            raise ValueError("the leader (node_rank 0) needs secret_file (it signs for every node), not key_file")
        if self.members and len(self.members) != self.nnodes - 1:
            n = len(self.members)
            raise ValueError(f"members lists {n} addresses; nnodes {self.nnodes} means {self.nnodes - 1}")
        return self

    @property
    def is_leader(self) -> bool:
        return self.node_rank == 0


def _check_address(v: str) -> None:
    m = _ADDRESS.match(v)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{v!r} is not host:port (e.g. 'node1.example:8900' or '10.0.0.2:8900')")


class Settings(_Section):
    server: ServerSettings = Field(default_factory=ServerSettings)
    fallback: tuple[Rung, ...] = ()
    watchdog: WatchdogSettings = Field(default_factory=WatchdogSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)
    diagnostics: DiagnosticsSettings = Field(default_factory=DiagnosticsSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    logs: LogsSettings = Field(default_factory=LogsSettings)
    paths: PathsSettings = Field(default_factory=PathsSettings)
    notify: tuple[NotifyTarget, ...] = ()  # [[notify]]: supervisor/alerting, docs/OPERATIONS.md
    gpu: GpuSettings = Field(default_factory=GpuSettings)  # [gpu]: supervisor/config/gpu.py
    slate: SlateSettings = Field(default_factory=SlateSettings)  # [slate]: supervisor/config/slate.py
    group: GroupSettings | None = None  # [group]: multi-node (docs/MULTINODE.md); None: one node
    learned: LearnedSettings = Field(default_factory=LearnedSettings)  # [learned]: supervisor/config/fast.py
    caches: CachesSettings = Field(default_factory=CachesSettings)  # [caches]: supervisor/config/fast.py

    @field_validator("fallback", "notify", mode="before")
    @classmethod
    def _fallback_tuple(cls, v: object) -> object:
        return tuple(v) if isinstance(v, list) else v

    @field_validator("notify")
    @classmethod
    def _unique_targets(cls, v: tuple[NotifyTarget, ...]) -> tuple[NotifyTarget, ...]:
        return unique_names(v)

    @field_validator("fallback")
    @classmethod
    def _unique_rungs(cls, v: tuple[Rung, ...]) -> tuple[Rung, ...]:
        seen = {BASE_RUNG}
        for rung in v:
            if rung.name in seen:
                raise ValueError(f"two rungs are named {rung.name!r} (the base configuration is {BASE_RUNG!r})")
            seen.add(rung.name)
        return v

    @model_validator(mode="after")
    def _group_engine(self) -> Settings:
        if self.group is not None:
            other = [r.name for r in self.ladder if self.engine_of(r) != "sglang"]
            if other:
                raise ValueError(
                    f"[group] (multi-node) supervises SGLang only for now; rung(s) {', '.join(other)} run "
                    "vLLM, whose multi-node workers are not supervised yet (docs/ENGINES.md)"
                )
        return self

    @property
    def ladder(self) -> tuple[Rung, ...]:
        """The base configuration as rung 0, then the fallback rungs in order."""
        return (Rung(name=BASE_RUNG), *self.fallback)

    @property
    def state_dir(self) -> Path:
        return Path(self.paths.state_dir)

    @property
    def cache_dir(self) -> Path:
        """Where the kernel caches live: `[paths] cache_dir`, else inside the state directory."""
        return Path(self.paths.cache_dir) if self.paths.cache_dir else self.state_dir / "cache"

    def engine_of(self, rung: Rung) -> Engine:
        """The engine a rung runs: its own, else the base configuration's."""
        return rung.engine or self.server.engine

    def rung_index(self, name: str) -> int | None:
        for i, rung in enumerate(self.ladder):
            if rung.name == name:
                return i
        return None


def _as_command(v: object) -> object:
    return tuple(v) if isinstance(v, list) else v


def _check_command(v: tuple[str, ...]) -> tuple[str, ...]:
    if not v or not v[0]:
        raise ValueError("must name at least the program to run, e.g. ['python3', '-m', 'sglang.launch_server']")
    return v


def _check_arg_names(args: Mapping[str, object]) -> None:
    for key in args:
        if not key or key.startswith("-") or " " in key:
            raise ValueError(f"argument name {key!r}: write it without dashes, e.g. 'tp-size'")
        if key in ("host", "port"):
            raise ValueError(f"{key!r} is set by [server] {key}, not in args")


# The TOML words for what a key holds, for "must be X (got Y)" sentences.
_TOML_KIND = {
    dict: "a table",
    list: "an array",
    tuple: "an array",
    str: "a string",
    bool: "true/false",
    int: "an integer",
    float: "a number",
}
_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "tuple_type": "an array",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
}
# Pydantic names each branch of a union in the error's location (`server.args.x.int`); the
# operator only needs the key.
_UNION_TAG = re.compile(r"^(bool|int|float|str|list\[.*\])$")
_ARG_VALUE = "true/false, a number, a string, or an array of numbers and strings"


def _kind(value: object) -> str:
    for typ, word in _TOML_KIND.items():
        if type(value) is typ:
            return word
    return type(value).__name__


def _key_path(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], bool]:
    """The key's path without union-branch tags, and whether a union branch was cut off."""
    for i, part in enumerate(loc):
        if i >= 2 and loc[i - 2] == "args" and isinstance(part, str) and _UNION_TAG.match(part):
            return loc[:i], True
    return loc, False


def _dotted(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def _sentence(loc: tuple[int | str, ...], e: Mapping[str, Any]) -> str:
    """One plain sentence for a shape error: what the key must be and what it got."""
    got = _kind(e.get("input"))
    if loc == ("fallback",) and isinstance(e.get("input"), dict):
        return "fallback: each rung is its own [[fallback]] table (double brackets), not one [fallback] table"
    if loc == ("server", "command"):
        return (
            f'server.command: must be an array of strings, e.g. ["python3", "-m", "sglang.launch_server"] (got {got})'
        )
    expected = _EXPECTED.get(str(e["type"]))
    if expected is None:
        return f"{_dotted(loc)}: {e['msg']}"
    if len(loc) >= 2 and loc[-2] == "command" and expected == "a string":
        return f"{_dotted(loc)}: each element of server.command must be a string (got {got})"
    return f"{_dotted(loc)}: must be {expected} (got {got})"


def _format_errors(err: ValidationError) -> str:
    lines: list[str] = []
    unions: set[tuple[int | str, ...]] = set()
    for e in err.errors():
        loc, in_union = _key_path(tuple(e["loc"]))
        if in_union:
            if loc not in unions:
                unions.add(loc)
                lines.append(f"{_dotted(loc)}: must be {_ARG_VALUE} (got {_kind(e.get('input'))})")
            continue
        if e["type"] == "extra_forbidden":
            lines.append(f"{_dotted(loc)}: unknown key (check the spelling against docs/CONFIGURATION.md)")
        else:
            lines.append(_sentence(loc, e))
    return "\n".join(lines)


def settings_from_mapping(data: Mapping[str, Any]) -> Settings:
    try:
        return Settings.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(_format_errors(err)) from None


def _int_keys() -> frozenset[str]:
    """Dotted keys of the sections whose value is an int: an expansion there is coerced."""
    keys: set[str] = set()
    for section, field in Settings.model_fields.items():
        model = field.annotation
        for arg in getattr(model, "__args__", (model,)):
            for key, sub in getattr(arg, "model_fields", {}).items():
                if sub.annotation is int:
                    keys.add(f"{section}.{key}")
    return frozenset(keys)


def load_settings(path: str | Path, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate a TOML config; raise ConfigError naming the file and the bad keys.

    `${VAR}` and `${VAR:-default}` in string values are expanded from `env` (the daemon's own
    environment when None) before validation (supervisor/config/expand.py)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as err:
        raise ConfigError(f"{p}: cannot read config: {err.strerror or err}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{p}: not valid TOML: {err}") from None
    try:
        data = expand(data, os.environ if env is None else env, _int_keys())
    except ExpansionError as err:
        raise ConfigError(f"{p}:\n{err}") from None
    try:
        return settings_from_mapping(data)
    except ConfigError as err:
        raise ConfigError(f"{p}:\n{err}") from None
