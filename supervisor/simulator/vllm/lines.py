"""Every line the vLLM mode prints, with where vLLM 0.26.0 prints it (paths under `vllm/`).

A `LogSite` is one `logger.<level>(...)` call: its file and line are what vLLM's formatter shows in
`[file.py:line]` (vllm/logger.py:22 `_FORMAT`; `*_once` calls pass `stacklevel=3`, so the line is the
caller's, vllm/logger.py:82), and its template is the call's own format string, applied with `%` as
logging does. A `SourceText` is any other string the simulator takes from the source (a bar's
description, a title, an exception's message, a traceback frame's code line). The fixture
tests/fixtures/vllm_source/reference.json holds what the source has at each of these places, and
tests/fidelity/test_vllm_fidelity.py holds this file and the simulator's output against it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

VLLM_VERSION = "0.26.0"


@dataclass(frozen=True)
class LogSite:
    path: str  # under vllm/
    line: int  # the line of the logger call
    level: str  # the record's levelname
    template: str  # the format string as the source has it (None in the fixture when it is built at run time)

    @property
    def filename(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class SourceText:
    """`text` appears verbatim in `path` within `span` lines from `line`."""

    path: str
    line: int
    text: str
    span: int = 1


# --- the API server process (vllm serve's main process) -------------------------------------------------------
# api_utils.py:323-345 `log_version_and_model`: the monochrome logo whenever vLLM's own handler formats the
# record (NewLineFormatter, no colour when stdout is not a terminal); built at run time, so its lines are
# checked as SourceTexts below.
LOGO = LogSite(
    "entrypoints/serve/utils/api_utils.py",
    345,
    "INFO",
    "\n       █     █     █▄   ▄█\n"
    " ▄▄ ▄█ █     █     █ ▀▄▀ █  version %s\n"
    "  █▄█▀ █     █     █     █  model   %s\n"
    "   ▀▀  ▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀\n",
)
NON_DEFAULT_ARGS = LogSite("entrypoints/serve/utils/api_utils.py", 273, "INFO", "non-default args: %s")
RESOLVED_ARCHITECTURE = LogSite("config/model.py", 623, "INFO", "Resolved architecture: %s")
MAX_MODEL_LEN = LogSite("config/model.py", 1788, "INFO", "Using max model len %s")
CHUNKED_PREFILL = LogSite(
    "config/scheduler.py", 252, "INFO", "Chunked prefill is enabled with max_num_batched_tokens=%d."
)
ASYNC_SCHEDULING_UNSUPPORTED = LogSite(
    "config/vllm.py",
    1077,
    "WARNING",
    "Async scheduling not supported with %s-based speculative decoding and will be disabled.",
)
ASYNC_SCHEDULING = LogSite("config/vllm.py", 1109, "INFO", "Asynchronous scheduling is %s.")
ENFORCE_EAGER = LogSite(
    "config/vllm.py",
    1163,
    "WARNING",
    "Enforce eager set, disabling torch.compile and CUDAGraphs. "
    "This is equivalent to setting -cc.mode=none -cc.cudagraph_mode=none",
)
CUDAGRAPH_EAGER = LogSite("config/vllm.py", 1392, "INFO", "Cudagraph is disabled under eager mode")
SUPPORTED_TASKS = LogSite("entrypoints/openai/api_server.py", 673, "INFO", "Supported tasks: %s")
STARTING_SERVER = LogSite("entrypoints/openai/api_server.py", 677, "INFO", "Starting vLLM server on %s")
ROUTES = LogSite("entrypoints/launcher.py", 37, "INFO", "Available routes are:")
ROUTE = LogSite("entrypoints/launcher.py", 46, "INFO", "Route: %s, Methods: %s")
# loggers.py:310 `log_fn(self.log_prefix + ", ".join(log_parts), *log_args)`: the parts are SourceTexts below.
STATS = LogSite(
    "v1/metrics/loggers.py",
    310,
    "INFO",
    "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
    "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
)
SPEC_DECODING = LogSite(
    "v1/spec_decode/metrics.py",
    120,
    "INFO",
    "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, "
    "Drafted throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, "
    "Per-position acceptance rate: %s, Avg Draft acceptance rate: %.1f%%",
)
OUTPUT_HANDLER_FAILED = LogSite("v1/engine/async_llm.py", 704, "ERROR", "AsyncLLM output_handler failed.")
ENGINE_CORE_EXITED = LogSite(
    "v1/engine/core_client.py", 702, "WARNING", "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup"
)
CLIENT_SHUTDOWN_START = LogSite("v1/engine/core_client.py", 655, "INFO", "[shutdown] MPClient: start timeout=%s")
CLIENT_STOPPING_MANAGER = LogSite(
    "v1/engine/core_client.py", 657, "INFO", "[shutdown] MPClient: stopping engine manager"
)
CLIENT_MANAGER_STOPPED = LogSite("v1/engine/core_client.py", 659, "INFO", "[shutdown] MPClient: engine manager stopped")
CLIENT_CLEANING_UP = LogSite(
    "v1/engine/core_client.py", 660, "INFO", "[shutdown] MPClient: cleaning up background resources"
)
CLIENT_SHUTDOWN_COMPLETE = LogSite("v1/engine/core_client.py", 662, "INFO", "[shutdown] MPClient: complete")
FORCE_KILLING = LogSite(
    "v1/utils.py", 626, "WARNING", "[shutdown] Process manager: force killing remaining processes count=%d"
)
API_SHUTDOWN_TRIGGERED = LogSite("entrypoints/launcher.py", 100, "INFO", "[shutdown] API server: shutdown triggered")
API_STOPPING_CLIENT = LogSite(
    "entrypoints/launcher.py", 116, "INFO", "[shutdown] API server: stopping engine client mode=%s timeout=%ss"
)
API_CLIENT_STOPPED = LogSite("entrypoints/launcher.py", 125, "INFO", "[shutdown] API server: engine client stopped")
API_SIGNALLING_HTTP = LogSite(
    "entrypoints/launcher.py", 128, "INFO", "[shutdown] API server: signalling HTTP server shutdown"
)
API_SHUTTING_DOWN_HTTP = LogSite(
    "entrypoints/launcher.py", 149, "INFO", "[shutdown] API server: shutting down FastAPI HTTP server"
)
# --enable-log-requests (and the log flood, flood.py): one record per request received.
REQUEST_RECEIVED = LogSite(
    "entrypoints/serve/utils/request_logger.py", 63, "INFO", "Received request %s: params: %s, lora_request: %s."
)

# --- the engine core process -------------------------------------------------------------------------------------
INIT_ENGINE = LogSite("v1/engine/core.py", 116, "INFO", "Initializing a V1 LLM engine (v%s) with config: %s")
REDUCING_TORCH_PARALLELISM = LogSite(
    "v1/executor/multiproc_executor.py",
    1070,
    "WARNING",
    "Reducing Torch parallelism from %d threads to %d to avoid unnecessary CPU contention. "
    "Set OMP_NUM_THREADS in the external environment to tune this value as needed.",
)
DP_GROUP_LEADER = LogSite(
    "v1/executor/multiproc_executor.py",
    140,
    "INFO",
    "DP group leader: node_rank=%d, node_rank_within_dp=%d, master_addr=%s, mq_connect_ip=%s (local), "
    "world_size=%d, local_world_size=%d",
)
GPU_KV_CACHE_SIZE = LogSite("v1/core/kv_cache_utils.py", 2177, "INFO", "GPU KV cache size: %s tokens")
MAX_CONCURRENCY = LogSite(
    "v1/core/kv_cache_utils.py", 2178, "INFO", "Maximum concurrency for %s tokens per request: %.2fx"
)
INIT_ENGINE_TOOK_COMPILED = LogSite(
    "v1/engine/core.py",
    340,
    "INFO",
    "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)",
)
INIT_ENGINE_TOOK = LogSite(
    "v1/engine/core.py", 347, "INFO", "init engine (profile, create kv cache, warmup model) took %.2f s"
)
WORKER_DIED = LogSite(
    "v1/executor/multiproc_executor.py",
    284,
    "ERROR",
    "Worker proc %s died unexpectedly (exit code: %s), shutting down executor.",
)
EXECUTOR_WAITING = LogSite(
    "v1/executor/multiproc_executor.py", 429, "INFO", "[shutdown] Executor: waiting for worker exit count=%d"
)
EXECUTOR_EXITED = LogSite(
    "v1/executor/multiproc_executor.py", 436, "INFO", "[shutdown] Executor: all workers exited gracefully"
)
EXECUTOR_SIGTERM = LogSite(
    "v1/executor/multiproc_executor.py",
    441,
    "WARNING",
    "[shutdown] Executor: workers still running after grace period; sending SIGTERM count=%d",
)
EXECUTOR_SIGKILL = LogSite(
    "v1/executor/multiproc_executor.py",
    451,
    "WARNING",
    "[shutdown] Executor: workers still running after SIGTERM; sending SIGKILL count=%d",
)
ENGINE_FAILED_TO_START = LogSite("v1/engine/core.py", 1330, "ERROR", "EngineCore failed to start.")
ENGINE_FATAL = LogSite("v1/engine/core.py", 1332, "ERROR", "EngineCore encountered a fatal error.")
ENGINE_SIGNAL = LogSite("v1/engine/core.py", 1313, "INFO", "[shutdown] EngineCore: trigger received signal=%s")
ENGINE_EXITING = LogSite("v1/engine/core.py", 1326, "INFO", "[shutdown] EngineCore: exiting busy loop")
ENGINE_SHUTDOWN_START = LogSite("v1/engine/core.py", 1432, "INFO", "[shutdown] EngineCore: start mode=%s timeout=%ds")
ENGINE_SHUTDOWN_ABORTING = LogSite(
    "v1/engine/core.py", 1441, "INFO", "[shutdown] EngineCore: aborting in-flight requests count=%d"
)
ENGINE_SHUTDOWN_DONE = LogSite(
    "v1/engine/core.py", 1463, "INFO", "[shutdown] EngineCore: request processing complete; starting resource teardown"
)

# --- a worker (its own process under the multiproc executor; inside the engine core at world size 1) -----------
DIST_INIT = LogSite(
    "distributed/parallel_state.py",
    1615,
    "INFO",
    "world_size=%d rank=%d local_rank=%d distributed_init_method=%s backend=%s",
)
RANK_ASSIGNED = LogSite(
    "distributed/parallel_state.py",
    1946,
    "INFO",
    "rank %s in world size %s is assigned as DP rank %s, PP rank %s, PCP rank %s, TP rank %s, EP rank %s, EPLB rank %s",
)
V2_MODEL_RUNNER = LogSite("v1/worker/gpu_worker.py", 378, "INFO", "Using V2 Model Runner")
ATTENTION_BACKEND = LogSite(
    "platforms/cuda.py", 482, "INFO", "Using %s attention backend out of potential backends: %s."
)
LOADING_FROM_SCRATCH = LogSite("v1/worker/gpu/model_runner.py", 284, "INFO", "Loading model from scratch...")
STARTING_TO_LOAD = LogSite("v1/worker/gpu_model_runner.py", 5250, "INFO", "Starting to load model %s...")
LOADING_DRAFTER = LogSite("v1/worker/gpu_model_runner.py", 5274, "INFO", "Loading drafter model...")
FILESYSTEM = LogSite(
    "model_executor/model_loader/weight_utils.py",
    869,
    "INFO",
    "Filesystem type for checkpoints: %s. Checkpoint size: %.2f GiB. Available RAM: %.2f GiB.",
)
NO_PREFETCH = LogSite(
    "model_executor/model_loader/weight_utils.py",
    892,
    "INFO",
    "Auto-prefetch is disabled because the filesystem (%s) is not a recognized network FS (NFS/Lustre). "
    "If you want to force prefetching, start vLLM with --safetensors-load-strategy=prefetch.",
)
LOADING_WEIGHTS_TOOK = LogSite(
    "model_executor/model_loader/default_loader.py", 430, "INFO", "Loading weights took %.2f seconds"
)
MODEL_LOADING_TOOK_V2 = LogSite(
    "v1/worker/gpu/model_runner.py", 305, "INFO", "Model loading took %s GiB and %.6f seconds"
)
MODEL_LOADING_TOOK_V1 = LogSite(
    "v1/worker/gpu_model_runner.py", 5347, "INFO", "Model loading took %s GiB memory and %.6f seconds"
)
COMPILE_CACHE_DIR = LogSite(
    "compilation/backends.py", 1094, "INFO", "Using cache directory: %s for vLLM's torch.compile"
)
DYNAMO_TIME = LogSite("compilation/backends.py", 1155, "INFO", "Dynamo bytecode transform time: %.2f s")
CACHE_THE_GRAPH = LogSite("compilation/backends.py", 378, "INFO", "Cache the graph of compile range %s for later use")
COMPILING_GRAPH = LogSite("compilation/backends.py", 393, "INFO", "Compiling a graph for compile range %s takes %.2f s")
AOT_LOADED = LogSite("compilation/decorators.py", 311, "INFO", "Directly load AOT compilation from path %s")
# monitor.py:53 `logger.info_once(message, total_compile_time)` with monitor.py:20's default message.
TORCH_COMPILE_TOOK = LogSite("compilation/monitor.py", 53, "INFO", "torch.compile took %.2f s in total")
PROFILING_RUN_TOOK = LogSite("compilation/monitor.py", 81, "INFO", "Initial profiling/warmup run took %.2f s")
AVAILABLE_KV_MEMORY = LogSite("v1/worker/gpu_worker.py", 560, "INFO", "Available KV cache memory: %s GiB")
GRAPH_CAPTURING_FINISHED_V2 = LogSite(
    "v1/worker/gpu/model_runner.py", 747, "INFO", "Graph capturing finished in %.0f secs, took %.2f GiB"
)
GRAPH_CAPTURING_FINISHED_V1 = LogSite(
    "v1/worker/gpu_model_runner.py", 6844, "INFO", "Graph capturing finished in %.0f secs, took %.2f GiB"
)
PARENT_EXITED = LogSite(
    "v1/executor/multiproc_executor.py", 793, "INFO", "Parent process exited, terminating worker queues"
)
WORKER_FAILED_TO_START = LogSite("v1/executor/multiproc_executor.py", 901, "ERROR", "WorkerProc failed to start.")

WORKER_HIT_EXCEPTION = LogSite("v1/executor/multiproc_executor.py", 1007, "ERROR", "WorkerProc hit an exception.")
# shm_broadcast.py:705 `logger.info(LONG_WAIT_TIME_LOG_MSG, VLLM_RINGBUFFER_WARNING_INTERVAL)`, the message at :95-101:
# a reader of the executor's queues (the engine core waiting for its workers) that waits with no
# `indefinite` flag says so every VLLM_RINGBUFFER_WARNING_INTERVAL (60) seconds.
SHM_LONG_WAIT = LogSite(
    "distributed/device_communicators/shm_broadcast.py",
    705,
    "INFO",
    "No available shared memory broadcast block found in %d seconds. This typically happens when some processes "
    "are hanging or doing some time-consuming work (e.g. compilation, weight/kv cache quantization).",
)

# --- a headless node (vllm serve --headless on nodes >= 1) --------------------------------------------------------
HEADLESS = LogSite(
    "entrypoints/cli/serve.py",
    212,
    "INFO",
    "Launching vLLM (v%s) headless multiproc executor, with head node address %s for torch.distributed process group.",
)

# --- strings other than log templates ---------------------------------------------------------------------------
LOG_FORMAT = SourceText("logger.py", 22, '"[%(fileinfo)s:%(lineno)d] %(message)s"', span=4)
DATE_FORMAT = SourceText("logger.py", 26, '_DATE_FORMAT = "%m-%d %H:%M:%S"')
NEWLINE_FORMAT = SourceText("logging_utils/formatter.py", 74, 'msg = msg.replace("\\n", "\\r\\n" + parts[0])')
LOG_STREAM = SourceText("envs.py", 43, 'VLLM_LOGGING_STREAM: str = "ext://sys.stdout"')
LOG_PREFIX = SourceText("utils/system_utils.py", 209, 'prefix = f"({worker_name} pid={pid}) "')
TITLE_FORMAT = SourceText("utils/system_utils.py", 198, 'setproctitle.setproctitle(f"{prefix}::{name}")')
TITLE_PREFIX = SourceText("envs.py", 1725, 'os.getenv("VLLM_PROCESS_NAME_PREFIX", "VLLM")')
ENGINE_TITLE_DP = SourceText("v1/engine/core.py", 1267, 'process_title = f"EngineCore_DP{dp_rank}"')
ENGINE_TITLE = SourceText("v1/engine/core.py", 1269, 'process_title = "EngineCore"')
ENGINE_PROCESS_NAME = SourceText(
    "v1/engine/utils.py", 167, 'name=f"EngineCore_DP{global_index}" if is_dp else "EngineCore",'
)
WORKER_PROCESS_NAME = SourceText("v1/executor/multiproc_executor.py", 697, 'name=f"VllmWorker-{rank}",')
WORKER_TITLE_EARLY = SourceText("v1/executor/multiproc_executor.py", 1018, 'set_process_title(name="Worker")')
WORKER_TITLE_TP = SourceText("v1/executor/multiproc_executor.py", 1040, 'process_name += f"_TP{tp_rank}"')
WORKER_TITLE_PP = SourceText("v1/executor/multiproc_executor.py", 1036, 'process_name += f"_PP{pp_rank}"')
API_DECORATION = SourceText(
    "entrypoints/openai/api_server.py", 749, 'decorate_logs("APIServer", skip_if_decorated=True)'
)
LOGO_LINES = SourceText(
    "entrypoints/serve/utils/api_utils.py",
    328,
    '"\\n       ${w}█     █     █▄   ▄█${r}\\n"\n'
    '            " ${o}▄▄${r} ${b}▄█${r} ${w}█     █     █ ▀▄▀ █${r}  version ${w}%s${r}\\n"\n'
    '            "  ${o}█${r}${b}▄█▀${r} ${w}█     █     █     █${r}  model   ${w}%s${r}\\n"\n'
    '            "   ${b}▀▀${r}  ${w}▀▀▀▀▀ ▀▀▀▀▀ ▀     ▀${r}\\n"',
    span=4,
)
STATS_PARTS = SourceText(
    "v1/metrics/loggers.py",
    263,
    '"Avg prompt throughput: %.1f tokens/s",\n'
    '            "Avg generation throughput: %.1f tokens/s",\n'
    '            "Running: %d reqs",\n'
    '            "Waiting: %d reqs",',
    span=4,
)
STATS_CACHE_PARTS = SourceText(
    "v1/metrics/loggers.py",
    289,
    '"GPU KV cache usage: %.1f%%",\n                "Prefix cache hit rate: %.1f%%",',
    span=2,
)
STATS_PREFIX = SourceText("v1/metrics/loggers.py", 161, 'return "Engine {:03d}: ".format(self.engine_index)')
STATS_IDLE = SourceText("v1/metrics/loggers.py", 260, "log_fn = logger.debug if self.engine_is_idle else logger.info")
STATS_INTERVAL = SourceText("envs.py", 831, 'float(os.getenv("VLLM_LOG_STATS_INTERVAL", "10."))')
TORCH_COMPILE_MESSAGE = SourceText("compilation/monitor.py", 20, 'message: str = "torch.compile took %.2f s in total",')
SHARDS_BAR_FORMAT = SourceText(
    "model_executor/model_loader/weight_utils.py",
    634,
    '_BAR_FORMAT = "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]\\n"',
)
SHARDS_BAR_DESC = SourceText(
    "model_executor/model_loader/weight_utils.py", 855, 'loading_desc = "Loading safetensors checkpoint shards"'
)
CAPTURE_BAR_V2 = SourceText(
    "v1/worker/gpu/cudagraph_utils.py", 319, 'descs = tqdm(descs, desc=f"{progress_bar_desc} ({mode.name})")'
)
CAPTURE_DESC_V2 = SourceText(
    "v1/worker/gpu/cudagraph_utils.py", 298, 'progress_bar_desc: str = "Capturing CUDA graphs",'
)
CAPTURE_BAR_V1 = SourceText("v1/worker/gpu_model_runner.py", 6916, 'desc="Capturing CUDA graphs ({}, {})".format(')
DRAFT_PREFILL_BAR = SourceText(
    "v1/worker/gpu/spec_decode/autoregressive/speculator.py", 108, 'progress_bar_desc="Capturing prefill CUDA graphs",'
)
DRAFT_DECODE_BAR = SourceText(
    "v1/worker/gpu/spec_decode/autoregressive/speculator.py", 125, 'progress_bar_desc="Capturing decode CUDA graphs",'
)
ENGINE_DEAD_MESSAGE = SourceText(
    "v1/engine/exceptions.py",
    13,
    'ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."',
)
EXECUTOR_FAILED = SourceText("v1/engine/core.py", 1500, 'raise RuntimeError("Executor failed.")')
ENGINE_INIT_FAILED = SourceText(
    "v1/engine/utils.py",
    1273,
    '"Engine core initialization failed. "\n                "See root cause above. "\n'
    '                f"Failed core proc(s): {finished}"',
    span=3,
)
MODEL_DOES_NOT_EXIST = SourceText(
    "entrypoints/serve/engine/serving.py", 64, 'message=f"The model `{request.model}` does not exist.",'
)
HEALTH_ROUTE = SourceText(
    "entrypoints/serve/instrumentator/health.py", 22, '@router.get("/health", response_class=Response)'
)
HEALTH_DEAD = SourceText("entrypoints/serve/instrumentator/health.py", 33, "return Response(status_code=503)")
WATCHDOG_INTERVAL = SourceText("entrypoints/launcher.py", 162, "VLLM_WATCHDOG_TIME_S = 5.0")
EXECUTE_TIMEOUT = SourceText("envs.py", 1676, 'os.getenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "300")')
SHM_LONG_WAIT_MESSAGE = SourceText(
    "distributed/device_communicators/shm_broadcast.py",
    96,
    '"No available shared memory broadcast block found "\n    "in %d seconds. This typically happens "\n'
    '    "when some processes are hanging or doing some "\n    "time-consuming work (e.g. compilation, "\n'
    '    "weight/kv cache quantization)."',
    span=5,
)
RINGBUFFER_INTERVAL = SourceText("envs.py", 711, 'os.environ.get("VLLM_RINGBUFFER_WARNING_INTERVAL", "60")')
WORKER_FAILED_RPC = SourceText(
    "v1/executor/multiproc_executor.py",
    395,
    'f"Worker failed with error \'{result}\', please check the"\n                        " stack trace above for '
    'the root cause"',
    span=2,
)
WORKER_INIT_FAILED = SourceText(
    "v1/executor/multiproc_executor.py",
    740,
    '"WorkerProc initialization failed due to an exception in a "\n'
    '            "background process. See stack trace for root cause."',
    span=2,
)
WORKER_SHUTDOWN_TIMEOUT = SourceText("envs.py", 1680, 'os.getenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "5")')


def all_log_sites() -> list[LogSite]:
    return [value for value in globals().values() if isinstance(value, LogSite)]


def own_source_texts() -> list[SourceText]:
    """This module's cited texts; `crashes.all_source_texts` adds the traceback frames'."""
    return [value for value in globals().values() if isinstance(value, SourceText)]
