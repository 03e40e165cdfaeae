"""Tracebacks as vLLM 0.26.0's processes print them when they fail (a pip-installed vLLM's paths).

Every vLLM frame names a file, a line and the code on it; `cited_frames` hands them to the fidelity
fixture, which checks each code line against the source (torch's, uvloop's and the standard
library's frames are not checked: their source is not vendored here).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.simulator.vllm import lines
from supervisor.simulator.vllm.lines import SourceText

PKG = "/usr/local/lib/python3.12/dist-packages"  # where a pip-installed vLLM lives (SGLang's image too)
_VLLM = f"{PKG}/vllm"
_STDLIB = "/usr/lib/python3.12"


@dataclass(frozen=True)
class Frame:
    path: str  # under vllm/, or an absolute path for a frame outside vLLM
    line: int
    func: str
    code: str

    def render(self) -> str:
        if not self.code:  # a Cython frame (uvloop/loop.pyx): Python prints no source line for it
            return f'  File "{self.path}", line {self.line}, in {self.func}\n'
        where = self.path if self.path.startswith("/") else f"{_VLLM}/{self.path}"
        return f'  File "{where}", line {self.line}, in {self.func}\n    {self.code}\n'


def _render(frames: tuple[Frame, ...]) -> str:
    return "".join(frame.render() for frame in frames)


# multiprocessing's own frames above a child's target (Python 3.12's process.py)
_BOOTSTRAP = (
    Frame(f"{_STDLIB}/multiprocessing/process.py", 314, "_bootstrap", "self.run()"),
    Frame(f"{_STDLIB}/multiprocessing/process.py", 108, "run", "self._target(*self._args, **self._kwargs)"),
)

# A worker's model construction running out of memory (V2 model runner, a Llama-shaped model).
_WORKER_MAIN = Frame("v1/executor/multiproc_executor.py", 868, "worker_main", "worker = WorkerProc(*args, **kwargs)")
_WORKER_INIT = Frame("v1/executor/multiproc_executor.py", 637, "__init__", "self.worker.load_model()")
_UNI_EXECUTOR = (
    Frame(
        "v1/engine/core.py",
        1299,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    Frame("v1/engine/core.py", 1065, "__init__", "super().__init__("),
    Frame("v1/engine/core.py", 125, "__init__", "self.model_executor = executor_class(vllm_config)"),
    Frame("v1/executor/abstract.py", 109, "__init__", "self._init_executor()"),
    Frame("v1/executor/uniproc_executor.py", 68, "_init_executor", "self.driver_worker.load_model()"),
)
_LOAD_MODEL = (
    Frame(
        "v1/worker/gpu_worker.py",
        431,
        "load_model",
        "self.model_runner.load_model(load_dummy_weights=load_dummy_weights)",
    ),
)
_RUNNER_V2 = Frame("v1/worker/gpu/model_runner.py", 286, "load_model", "self.model = model_loader.load_model(")
_RUNNER_V1 = Frame("v1/worker/gpu_model_runner.py", 5266, "load_model", "self.model = model_loader.load_model(")
_INITIALIZE = (
    Frame("model_executor/model_loader/base_loader.py", 55, "load_model", "model = initialize_model("),
    Frame(
        "model_executor/model_loader/utils.py",
        63,
        "initialize_model",
        "model = model_class(vllm_config=vllm_config, prefix=prefix)",
    ),
)
_LLAMA = (
    Frame("model_executor/models/llama.py", 478, "__init__", "self.model = self._init_model("),
    Frame(
        "model_executor/models/llama.py",
        511,
        "_init_model",
        "return LlamaModel(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)",
    ),
    Frame("compilation/decorators.py", 383, "__init__", "old_init(self, *args, **kwargs)"),
    Frame(
        "model_executor/models/llama.py",
        383,
        "__init__",
        "self.start_layer, self.end_layer, self.layers = make_layers(",
    ),
    Frame(
        "model_executor/models/utils.py",
        825,
        "make_layers",
        'layer_fn(prefix=f"{prefix}.{idx}") for idx in range(start_layer, end_layer)',
    ),
    Frame(
        "model_executor/models/llama.py",
        385,
        "<lambda>",
        "lambda prefix: layer_type(vllm_config=vllm_config, prefix=prefix),",
    ),
    Frame("model_executor/models/llama.py", 297, "__init__", "self.mlp = LlamaMLP("),
    Frame("model_executor/models/llama.py", 92, "__init__", "self.gate_up_proj = MergedColumnParallelLinear("),
    Frame("model_executor/layers/linear.py", 634, "__init__", "super().__init__("),
)
_CREATE_WEIGHTS = (
    Frame("model_executor/layers/linear.py", 473, "__init__", "self.quant_method.create_weights("),
    Frame("model_executor/layers/linear.py", 201, "create_weights", "data=torch.empty("),
    Frame(f"{PKG}/torch/utils/_device.py", 104, "__torch_function__", "return func(*args, **kwargs)"),
)

# The engine core's busy loop meeting the executor's failure (a worker died while it was idle).
_BUSY_LOOP = (
    Frame("v1/engine/core.py", 1323, "run_engine_core", "engine_core.run_busy_loop()"),
    Frame("v1/engine/core.py", 1362, "run_busy_loop", "self._process_input_queue()"),
)
_EXECUTOR_FAILED = (
    Frame("v1/engine/core.py", 1385, "_process_input_queue", "self._handle_client_request(*req)"),
    Frame("v1/engine/core.py", 1500, "_handle_client_request", 'raise RuntimeError("Executor failed.")'),
)
# ... or waiting for a forward's output that never came (VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS).
_STEP_WAIT = (
    Frame("v1/engine/core.py", 1364, "run_busy_loop", "self._process_engine_step()"),
    Frame("v1/engine/core.py", 1403, "_process_engine_step", "outputs, model_executed = self.step_fn()"),
    Frame("v1/engine/core.py", 693, "step_with_batch_queue", "model_output = future.result()"),
    Frame("v1/executor/multiproc_executor.py", 90, "result", "future._wait_for_response()"),
    Frame(
        "v1/executor/multiproc_executor.py", 95, "_wait_for_response", "response = self.aggregate(self.get_response())"
    ),
)
_DEQUEUE = (
    Frame(
        "v1/executor/multiproc_executor.py", 390, "get_response", "status, result = mq.dequeue(timeout=dequeue_timeout)"
    ),
    Frame(
        "distributed/device_communicators/shm_broadcast.py",
        779,
        "dequeue",
        "with self.acquire_read(timeout, indefinite) as buf:",
    ),
    Frame(f"{_STDLIB}/contextlib.py", 137, "__enter__", "return next(self.gen)"),
    Frame(
        "distributed/device_communicators/shm_broadcast.py",
        698,
        "acquire_read",
        "self._spin_condition.wait(timeout_ms=read_timeout.timeout_ms())",
    ),
    Frame("distributed/device_communicators/shm_broadcast.py", 647, "timeout_ms", "raise TimeoutError"),
)
_RPC_TIMEOUT = (
    Frame(
        "v1/executor/multiproc_executor.py",
        392,
        "get_response",
        'raise TimeoutError(f"RPC call to {method} timed out.") from e',
    ),
)

# A worker's forward failing (crash_after_ready), and the engine core's RPC learning of it.
_WORKER_FORWARD = (
    Frame("v1/executor/multiproc_executor.py", 999, "worker_busy_loop", "output = func(*args, **kwargs)"),
    Frame("v1/worker/gpu_worker.py", 1083, "sample_tokens", "return self.model_runner.sample_tokens(grammar_output)"),
    Frame(f"{PKG}/torch/utils/_contextlib.py", 124, "decorate_context", "return func(*args, **kwargs)"),
    Frame("v1/worker/gpu/model_runner.py", 1592, "sample_tokens", "torch.accelerator.synchronize()"),
)
_WORKER_FAILED = (Frame("v1/executor/multiproc_executor.py", 394, "get_response", "raise RuntimeError("),)
# The executor shut its queues while the engine core waited for a forward's output (a worker died).
_CANCELLED = (
    Frame("distributed/device_communicators/shm_broadcast.py", 701, "acquire_read", 'raise RuntimeError("cancelled")'),
)
# The engine core's executor when a worker ended before READY.
_WAIT_FOR_READY = (
    Frame(
        "v1/engine/core.py",
        1299,
        "run_engine_core",
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    Frame("v1/engine/core.py", 1065, "__init__", "super().__init__("),
    Frame("v1/engine/core.py", 125, "__init__", "self.model_executor = executor_class(vllm_config)"),
    Frame("v1/executor/multiproc_executor.py", 108, "__init__", "super().__init__(vllm_config)"),
    Frame("v1/executor/abstract.py", 109, "__init__", "self._init_executor()"),
    Frame(
        "v1/executor/multiproc_executor.py",
        201,
        "_init_executor",
        "self.workers = WorkerProc.wait_for_ready(unready_workers)",
    ),
    Frame("v1/executor/multiproc_executor.py", 765, "wait_for_ready", "raise e from None"),
)
WORKER_INIT_FAILED = (
    "Exception: WorkerProc initialization failed due to an exception in a background process. "
    "See stack trace for root cause."
)

# The API server: the engine died before it was ready (vllm serve -> uvloop -> AsyncLLM -> the handshake).
_SERVE = (
    Frame("/usr/local/bin/vllm", 10, "<module>", "sys.exit(main())"),
    Frame("entrypoints/cli/main.py", 95, "main", "args.dispatch_function(args)"),
    Frame("entrypoints/cli/serve.py", 148, "cmd", "uvloop.run(run_server(args))"),
    Frame(f"{PKG}/uvloop/__init__.py", 96, "run", "return __asyncio.run("),
    Frame(f"{_STDLIB}/asyncio/runners.py", 194, "run", "return runner.run(main)"),
    Frame(f"{_STDLIB}/asyncio/runners.py", 118, "run", "return self._loop.run_until_complete(task)"),
    Frame("uvloop/loop.pyx", 1518, "uvloop.loop.Loop.run_until_complete", ""),
    Frame(f"{PKG}/uvloop/__init__.py", 48, "wrapper", "return await main"),
    Frame(
        "entrypoints/openai/api_server.py",
        759,
        "run_server",
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
    Frame("entrypoints/openai/api_server.py", 773, "run_server_worker", "async with build_async_engine_client("),
    Frame(f"{_STDLIB}/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
    Frame(
        "entrypoints/openai/api_server.py",
        139,
        "build_async_engine_client",
        "async with build_async_engine_client_from_engine_args(",
    ),
    Frame(f"{_STDLIB}/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
    Frame(
        "entrypoints/openai/api_server.py",
        175,
        "build_async_engine_client_from_engine_args",
        "async_llm = AsyncLLM.from_vllm_config(",
    ),
    Frame("v1/engine/async_llm.py", 217, "from_vllm_config", "return cls("),
    Frame("v1/engine/async_llm.py", 146, "__init__", "self.engine_core = EngineCoreClient.make_async_mp_client("),
    Frame("v1/engine/core_client.py", 132, "make_async_mp_client", "return AsyncMPClient(*client_args)"),
    Frame("v1/engine/core_client.py", 963, "__init__", "super().__init__("),
    Frame("v1/engine/core_client.py", 573, "__init__", "with launch_core_engines("),
    Frame(f"{_STDLIB}/contextlib.py", 144, "__exit__", "next(self.gen)"),
    Frame("v1/engine/utils.py", 1213, "launch_core_engines", "wait_for_engine_startup("),
    Frame("v1/engine/utils.py", 1272, "wait_for_engine_startup", "raise RuntimeError("),
)

# The API server binding its port before anything else (api_server.py:625-641), and its SIGTERM before ready.
_BIND = (
    Frame(
        "entrypoints/openai/api_server.py",
        758,
        "run_server",
        "listen_address, sock = setup_server(args, reuse_port=False)",
    ),
    Frame(
        "entrypoints/openai/api_server.py",
        637,
        "setup_server",
        "sock = create_server_socket(sock_addr, reuse_port=reuse_port)",
    ),
    Frame("entrypoints/openai/api_server.py", 586, "create_server_socket", "sock.bind(addr)"),
)
_INTERRUPTED = (
    Frame("v1/engine/utils.py", 1254, "wait_for_engine_startup", "events = poller.poll(STARTUP_POLL_PERIOD_MS)"),
    Frame(f"{PKG}/zmq/sugar/poll.py", 106, "poll", "return zmq_poll(self.sockets, timeout=timeout)"),
    Frame("entrypoints/openai/api_server.py", 754, "_interrupt_init", 'raise KeyboardInterrupt("terminated")'),
)

# The API server's output handler once the engine is gone.
_OUTPUT_HANDLER = (
    Frame("v1/engine/async_llm.py", 660, "output_handler", "outputs = await engine_core.get_output_async()"),
    Frame("v1/engine/core_client.py", 1061, "get_output_async", "raise self._format_exception(outputs) from None"),
)

ENGINE_DEAD_ERROR = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


def _oom(gpu: int, pid: int) -> str:
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. "
        f"GPU {gpu} has a total capacity of 139.81 GiB of which 402.06 MiB is free. Process {pid} has "
        "139.40 GiB memory in use. Of the allocated memory 138.68 GiB is allocated by PyTorch, and 11.75 MiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
    )


def _model_frames(v2_runner: bool, llama: bool) -> tuple[Frame, ...]:
    runner = _RUNNER_V2 if v2_runner else _RUNNER_V1
    return (*_LOAD_MODEL, runner, *_INITIALIZE, *(_LLAMA if llama else ()), *_CREATE_WEIGHTS)


_RERAISE = Frame("v1/engine/core.py", 1334, "run_engine_core", "raise e")


def _fatal(frames: tuple[Frame, ...], bootstrap: bool) -> str:
    """`logger.exception` in run_engine_core shows the frames from the busy loop down; multiprocessing's
    own print of the same exception (`Process EngineCore:`) adds its bootstrap and the `raise e`."""
    if bootstrap:
        frames = (*_BOOTSTRAP, _RERAISE, *frames)
    return "Traceback (most recent call last):\n" + _render(frames)


def forward_crash() -> str:
    """A worker's forward meeting an illegal memory access (`WorkerProc hit an exception.`), without the error line."""
    return "Traceback (most recent call last):\n" + _render(_WORKER_FORWARD)


def worker_failed(error: str, bootstrap: bool) -> str:
    """The engine core's step when the output rank answered FAILURE."""
    frames = (_BUSY_LOOP[0], *_STEP_WAIT, *_WORKER_FAILED)
    return _fatal(frames, bootstrap) + (
        f"RuntimeError: Worker failed with error '{error}', please check the stack trace above for the root cause\n"
    )


def cancelled(bootstrap: bool) -> str:
    """The engine core's step when the executor shut its queues under it (a worker died mid-forward)."""
    frames = (_BUSY_LOOP[0], *_STEP_WAIT, *_DEQUEUE[:4], *_CANCELLED)
    return _fatal(frames, bootstrap) + "RuntimeError: cancelled\n"


def workers_not_ready(bootstrap: bool) -> str:
    """`EngineCore failed to start.` after a worker ended before READY (multiproc_executor.py:736-766)."""
    return _fatal(_WAIT_FOR_READY, bootstrap) + WORKER_INIT_FAILED + "\n"


def load_oom(in_worker: bool, v2_runner: bool, llama: bool, gpu: int, pid: int) -> str:
    """The traceback of a CUDA OOM while the model is built, in a worker (`WorkerProc failed to start.`)
    or, at world size 1, in the engine core (`EngineCore failed to start.`)."""
    head = (_WORKER_MAIN, _WORKER_INIT) if in_worker else _UNI_EXECUTOR
    frames = (*head, *_model_frames(v2_runner, llama))
    return "Traceback (most recent call last):\n" + _render(frames) + _oom(gpu, pid)


def load_oom_bootstrap(v2_runner: bool, llama: bool, gpu: int, pid: int) -> str:
    """The same OOM as multiprocessing prints it when it ends the engine core (`raise e` at core.py:1334)."""
    return _fatal((*_UNI_EXECUTOR, *_model_frames(v2_runner, llama)), True) + _oom(gpu, pid)


def executor_failed(bootstrap: bool) -> str:
    """The engine core's busy loop after a worker died (`RuntimeError: Executor failed.`)."""
    return _fatal((*_BUSY_LOOP, *_EXECUTOR_FAILED), bootstrap) + "RuntimeError: Executor failed.\n"


def execute_model_timeout(bootstrap: bool) -> str:
    """A forward whose output never came within VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS: the dequeue's
    TimeoutError, then the RPC's, chained (`raise ... from e`)."""
    cause = "Traceback (most recent call last):\n" + _render(_DEQUEUE) + "TimeoutError\n"
    return (
        cause
        + "\nThe above exception was the direct cause of the following exception:\n\n"
        + _fatal((_BUSY_LOOP[0], *_STEP_WAIT, *_RPC_TIMEOUT), bootstrap)
        + "TimeoutError: RPC call to execute_model timed out.\n"
    )


def engine_init_failed(failed: dict[str, int]) -> str:
    """The API server's own traceback when an engine core process exited before it was ready."""
    return (
        "Traceback (most recent call last):\n"
        + _render(_SERVE)
        + f"RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {failed}\n"
    )


def bind_failed(errno: int, strerror: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        + _render((*_SERVE[:8], *_BIND))
        + f"OSError: [Errno {errno}] {strerror}\n"
    )


def interrupted() -> str:
    """SIGTERM while the engine starts: run_server's `_interrupt_init` (api_server.py:751-756), wherever the
    main thread was (here: waiting for the engine core's handshake)."""
    frames = (*_SERVE[:-1], *_INTERRUPTED)
    return "Traceback (most recent call last):\n" + _render(frames) + "KeyboardInterrupt: terminated\n"


def output_handler_dead() -> str:
    return "Traceback (most recent call last):\n" + _render(_OUTPUT_HANDLER) + ENGINE_DEAD_ERROR + "\n"


def cited_frames() -> list[SourceText]:
    """Every vLLM frame above, as a SourceText for the fixture (code lines only, not the frame's header)."""
    groups = (
        _WORKER_MAIN,
        _WORKER_INIT,
        *_UNI_EXECUTOR,
        *_LOAD_MODEL,
        _RUNNER_V2,
        _RUNNER_V1,
        *_INITIALIZE,
        *_LLAMA,
        *_CREATE_WEIGHTS,
        *_BUSY_LOOP,
        *_EXECUTOR_FAILED,
        *_STEP_WAIT,
        *_DEQUEUE,
        *_RPC_TIMEOUT,
        *_SERVE,
        *_OUTPUT_HANDLER,
        _RERAISE,
        *_WORKER_FORWARD,
        *_WORKER_FAILED,
        *_CANCELLED,
        *_WAIT_FOR_READY,
        *_BIND,
        *_INTERRUPTED,
    )
    return [
        SourceText(f.path, f.line, f.code)
        for f in groups
        if not f.path.startswith("/") and "/" in f.path and not f.path.startswith("uvloop")
    ]


def all_source_texts() -> list[SourceText]:
    """Every text the simulator cites from vLLM's source: the lines' and the traceback frames'."""
    return lines.own_source_texts() + cited_frames()
