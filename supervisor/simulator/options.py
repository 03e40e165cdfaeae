"""What the simulator is asked to do: read once from the environment, then passed down.

Behaviour is chosen by environment variables only, so nothing about the scenario appears on the
command line or in the output: the supervisor sees a server, not a test double.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

GPU_FILE_ENV = "SGLANG_SIM_GPU_FILE"  # the simulated GPU's JSON file, shared with the daemon's [gpu] file


class Scenario(str, enum.Enum):
    OK = "ok"  # starts and serves
    SLOW_LOAD = "slow_load"  # shards crawl in while the weights file keeps being read
    QUIET_LOAD = "quiet_load"  # a long silence after `Load weight begin.`, then a normal start
    DEADLOCK_AFTER_LOAD = "deadlock_after_load"  # two threads, two locks, opposite order: idle hang
    BUSY_HANG_AFTER_LOAD = "busy_hang_after_load"  # a thread spins on a flag nobody sets
    CRASH_ON_LOAD = "crash_on_load"  # CUDA OOM traceback during the weight load, exit 1
    CRASH_AFTER_READY = "crash_after_ready"  # a scheduler exception after ready takes the tree down
    RANK_DIES = "rank_dies"  # one scheduler segfaults; the front stays up, generation hangs
    HEALTH_HANGS = "health_hangs"  # the scheduler stops answering; /health 503 after the timeout
    SERVING_STALL = "serving_stall"  # requests admitted, decode makes no progress, /health 200
    LOW_ACCEPT = "low_accept"  # speculative acceptance ~1.15 tokens per verify step
    IGNORE_SIGTERM = "ignore_sigterm"  # every process ignores SIGTERM
    ESCAPE_GROUP = "escape_group"  # a helper leaves the session and keeps the port
    LOG_FLOOD = "log_flood"  # hundreds of MB of output, some of it not UTF-8
    BUSY_CAPTURE_HANG = "busy_capture_hang"  # a never-ending kernel in the draft graph's capture: a spin
    LONG_COMPILE = "long_compile"  # a silent first compile: CPU in inductor/triton frames, nothing else moves
    # nvidia-resiliency-ext's fault catalogue (issue 35): LOCK_GIL and GPU_SLEEP after the weights load.
    LOCK_GIL_AFTER_LOAD = "lock_gil_after_load"  # native sleep holding the GIL (ctypes.PyDLL): idle, nothing runs
    GPU_SLEEP_AFTER_LOAD = "gpu_sleep_after_load"  # a kernel that never ends; the host spins in synchronize
    IO_WAIT_AFTER_LOAD = "io_wait_after_load"  # the scheduler's main thread in D state in the kernel: io_wait
    # issue 51: wedges /health does not see (the engine stops; its health check's own path does not need it).
    # SGLang #40809 (0.5.19; vLLM's #53130 is the same shape): the scheduler's loop turns but admits nothing
    # more; requests queue, none starts, /health 200.
    QUEUE_WEDGE = "queue_wedge"
    # SGLang #28815 (tp >= 2): an EAGLE verify step skips its broadcast on rank 0; the other ranks wait in
    # that collective for good, rank 0 goes idle past it; the running batch never finishes, /health 200.
    VERIFY_SKIPS_BROADCAST = "verify_skips_broadcast"
    # issue 51: a hang in each role (after ready; the scheduler's own is HEALTH_HANGS). Each prints nothing.
    FRONTEND_HANG = "frontend_hang"  # main's event loop blocks in a callback: no request read or answered
    DETOKENIZER_HANG = "detokenizer_hang"  # the detokenizer blocks in a lock while decoding: no output reaches main
    COLLECTIVE_SKIPPED = "collective_skipped"  # the last rank skips a forward's all-reduce (SGLang #33289)


#: Faults that begin a while after the server is ready (SGLANG_SIM_FAULT_AFTER_S).
AFTER_READY = frozenset(
    {Scenario.CRASH_AFTER_READY, Scenario.RANK_DIES, Scenario.HEALTH_HANGS, Scenario.SERVING_STALL}
    | {Scenario.QUEUE_WEDGE, Scenario.VERIFY_SKIPS_BROADCAST}  # issue 51
)


# issue 51: a hang in each role: faults that begin SGLANG_SIM_FAULT_AFTER_S after the ready line.
ROLE_HANGS = frozenset({Scenario.FRONTEND_HANG, Scenario.DETOKENIZER_HANG, Scenario.COLLECTIVE_SKIPPED})


class SettingsError(ValueError):
    """A simulator variable has a value it cannot use; the message names it and the fix."""


@dataclass(frozen=True)
class SimSettings:
    scenario: Scenario  # what runs: `requested`, or OK when an SGLANG_SIM_UNLESS flag was given
    requested: Scenario
    pace: float = 1.0
    shard_s: float | None = None  # None: 0.5 s per shard times pace (33 s in slow_load)
    quiet_s: float | None = None  # None: 60 s times pace
    fault_after_s: float = 3.0
    health_latency_s: float = 1.0
    health_check_timeout_s: float = 20.0
    flood_mb: float = 256.0
    onset_file: str | None = None
    mem_mb: float = 16.0
    decode_step_s: float = 0.02
    idle_metrics_s: float = 30.0
    import_s: float | None = None  # None: 0.5 s times pace (real SGLang 0.5.16: ~33 s)
    prefill_compile_s: float | None = None  # None: 0.5 s times pace (real: 68-105 s at 0/58)
    coredump_wait_s: float | None = None  # None: SGLang's 60 s times pace
    shm_dir: str | None = None  # SGLANG_SIM_SHM_DIR: where schedulers create their shm segment
    compile_s: float | None = None  # None: 30 s times pace (long_compile's silent compilation)
    gpu_file: str | None = None  # the simulated GPU's JSON file (supervisor/simulator/gpu): kernels show there

    @property
    def import_seconds(self) -> float:
        """A child's silent import of SGLang before it names itself and logs (the main's: a quarter)."""
        return self.import_s if self.import_s is not None else 0.5 * self.pace

    @property
    def prefill_compile_seconds(self) -> float:
        return self.prefill_compile_s if self.prefill_compile_s is not None else 0.5 * self.pace

    @property
    def compile_seconds(self) -> float:
        return self.compile_s if self.compile_s is not None else 30.0 * self.pace

    @property
    def coredump_wait_seconds(self) -> float:
        return self.coredump_wait_s if self.coredump_wait_s is not None else 60.0 * self.pace

    @property
    def shard_seconds(self) -> float:
        if self.shard_s is not None:
            return self.shard_s
        if self.scenario is Scenario.SLOW_LOAD:
            return 33.0
        return 0.5 * self.pace

    @property
    def quiet_seconds(self) -> float:
        return self.quiet_s if self.quiet_s is not None else 60.0 * self.pace


def _float(env: Mapping[str, str], name: str, default: float, minimum: float = 0.0) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number; set it to e.g. {default:g}") from None
    if value != value or value < minimum:
        raise SettingsError(f"{name}={raw!r} must be a number >= {minimum:g}")
    return value


def _optional_float(env: Mapping[str, str], name: str) -> float | None:
    return _float(env, name, -1.0) if env.get(name, "").strip() else None


def flag_given(argv: Sequence[str], name: str) -> bool:
    """Whether `--name` appears in argv, bare (`--name`) or with a value (`--name v`, `--name=v`)."""
    flag = "--" + name.strip().lstrip("-")
    return any(arg == flag or arg.startswith(flag + "=") for arg in argv)


def effective_scenario(requested: Scenario, unless: str, argv: Sequence[str]) -> Scenario:
    names = [n for n in (part.strip() for part in unless.split(",")) if n]
    if any(flag_given(argv, name) for name in names):
        return Scenario.OK
    return requested


def _fault_began(onset_file: str | None) -> bool:
    """Whether an earlier launch's fault began (its onset file records an onset time)."""
    if not onset_file:
        return False
    try:
        with open(onset_file, encoding="utf-8") as f:
            return json.load(f).get("onset_wall") is not None
    except (OSError, ValueError, AttributeError):
        return False


def load_settings(env: Mapping[str, str], argv: Sequence[str]) -> SimSettings:
    raw = env.get("SGLANG_SIM_SCENARIO", "").strip() or Scenario.OK.value
    try:
        requested = Scenario(raw)
    except ValueError:
        choices = ", ".join(s.value for s in Scenario)
        raise SettingsError(f"SGLANG_SIM_SCENARIO={raw!r} is unknown; use one of: {choices}") from None
    pace = _float(env, "SGLANG_SIM_PACE", 1.0)
    onset_file = env.get("SGLANG_SIM_ONSET_FILE", "").strip() or None
    scenario = effective_scenario(requested, env.get("SGLANG_SIM_UNLESS", ""), argv)
    if env.get("SGLANG_SIM_FAULT_ONCE", "").strip() in ("1", "true") and _fault_began(onset_file):
        scenario = Scenario.OK  # a one-off fault (an Xid, a hang that a relaunch clears) already happened
    return SimSettings(
        scenario=scenario,
        requested=requested,
        pace=pace,
        shard_s=_optional_float(env, "SGLANG_SIM_SHARD_S"),
        quiet_s=_optional_float(env, "SGLANG_SIM_QUIET_S"),
        fault_after_s=_float(env, "SGLANG_SIM_FAULT_AFTER_S", 3.0),
        health_latency_s=_float(env, "SGLANG_SIM_HEALTH_LATENCY_S", 1.0, minimum=0.001),
        health_check_timeout_s=_float(env, "SGLANG_HEALTH_CHECK_TIMEOUT", 20.0),
        flood_mb=_float(env, "SGLANG_SIM_FLOOD_MB", 256.0),
        onset_file=onset_file,
        mem_mb=_float(env, "SGLANG_SIM_MEM_MB", 16.0),
        decode_step_s=_float(env, "SGLANG_SIM_DECODE_STEP_S", 0.02, minimum=0.001),
        idle_metrics_s=_float(env, "SGLANG_SIM_IDLE_METRICS_S", 30.0, minimum=0.1),
        import_s=_optional_float(env, "SGLANG_SIM_IMPORT_S"),
        prefill_compile_s=_optional_float(env, "SGLANG_SIM_PREFILL_COMPILE_S"),
        coredump_wait_s=_optional_float(env, "SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS"),
        shm_dir=env.get("SGLANG_SIM_SHM_DIR", "").strip() or None,
        compile_s=_optional_float(env, "SGLANG_SIM_COMPILE_S"),
        gpu_file=env.get(GPU_FILE_ENV, "").strip() or None,
    )
