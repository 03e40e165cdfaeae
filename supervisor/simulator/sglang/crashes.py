"""Tracebacks as SGLang's processes print them when they fail (paths of a pip-installed SGLang)."""

from __future__ import annotations

PKG = "/usr/local/lib/python3.12/dist-packages"  # where a pip-installed SGLang lives
_PKG = PKG
_SRT = f"{_PKG}/sglang/srt"


def _frames(frames: list[tuple[str, int, str, str]]) -> str:
    return "".join(f'  File "{path}", line {line}, in {func}\n    {code}\n' for path, line, func, code in frames)


def load_oom_traceback(rank: int, pid: int) -> str:
    """A scheduler's `Scheduler hit an exception:` record for a CUDA OOM while loading weights."""
    frames = _frames(
        [
            (f"{_SRT}/managers/scheduler.py", 2912, "run_scheduler_process", "scheduler = Scheduler("),
            (f"{_SRT}/managers/scheduler.py", 318, "__init__", "self.tp_worker = TpWorkerClass("),
            (f"{_SRT}/managers/tp_worker.py", 84, "__init__", "self.model_runner = ModelRunner("),
            (f"{_SRT}/model_executor/model_runner.py", 242, "__init__", "self.initialize(min_per_gpu_memory)"),
            (f"{_SRT}/model_executor/model_runner.py", 318, "initialize", "self.load_model()"),
            (f"{_SRT}/model_executor/model_runner.py", 731, "load_model", "self.model = get_model("),
            (f"{_SRT}/model_loader/__init__.py", 28, "get_model", "return loader.load_model("),
            (f"{_SRT}/model_loader/loader.py", 594, "load_model", "self.load_weights_and_postprocess("),
            (f"{_SRT}/model_loader/loader.py", 602, "load_weights_and_postprocess", "model.load_weights(weights)"),
            (f"{_SRT}/models/deepseek_v2.py", 2791, "load_weights", "weight_loader(param, loaded_weight)"),
            (
                f"{_SRT}/layers/moe/fused_moe_triton/layer.py",
                640,
                "weight_loader",
                "loaded_weight = loaded_weight.to(param.device)",
            ),
        ]
    )
    return (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames
        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. "
        f"GPU {rank} has a total capacity of 139.72 GiB of which 1.21 GiB is free. "
        f"Process {pid} has 138.50 GiB memory in use. Of the allocated memory 136.90 GiB is allocated "
        "by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated "
        "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
        "fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
    )


def forward_crash_traceback() -> str:
    """A scheduler's record for an illegal memory access in a forward pass, after ready."""
    frames = _frames(
        [
            (f"{_SRT}/managers/scheduler.py", 2930, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            (f"{_PKG}/torch/utils/_contextlib.py", 116, "decorate_context", "return func(*args, **kwargs)"),
            (
                f"{_SRT}/managers/scheduler.py",
                1016,
                "event_loop_overlap",
                "self.process_batch_result(tmp_batch, tmp_result)",
            ),
            (
                f"{_SRT}/managers/scheduler.py",
                2105,
                "process_batch_result",
                "self.process_batch_result_decode(batch, result)",
            ),
            (
                f"{_SRT}/managers/scheduler_output_processor_mixin.py",
                262,
                "process_batch_result_decode",
                "result.copy_done.synchronize()",
            ),
            (f"{_PKG}/torch/cuda/streams.py", 231, "synchronize", "super().synchronize()"),
        ]
    )
    return (
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        + frames
        + "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
        "below might be incorrect.\n"
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n\n"
    )


def launch_eof_traceback() -> str:
    """The main process's own traceback when a scheduler dies before reporting ready."""
    frames = _frames(
        [
            (f"{_PKG}/sglang/launch_server.py", 29, "<module>", "launch_server(server_args)"),
            (
                f"{_SRT}/entrypoints/http_server.py",
                1421,
                "launch_server",
                "tokenizer_manager, template_manager, scheduler_info, *_ = (",
            ),
            (f"{_SRT}/entrypoints/engine.py", 939, "_launch_subprocesses", "data = scheduler_pipe_readers[i].recv()"),
            ("/usr/lib/python3.12/multiprocessing/connection.py", 250, "recv", "buf = self._recv_bytes()"),
            ("/usr/lib/python3.12/multiprocessing/connection.py", 430, "_recv_bytes", "buf = self._recv(4)"),
            ("/usr/lib/python3.12/multiprocessing/connection.py", 399, "_recv", "raise EOFError"),
        ]
    )
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n' + frames + "EOFError\n"
    )


def dist_init_traceback(error: str, store_side: bool) -> str:
    """A scheduler's record when `init_process_group`'s rendezvous fails (torch 2.11's messages):
    rank 0's store timing out waiting for clients, or another rank's client that never got in."""
    frames = _frames(
        [
            (f"{_SRT}/managers/scheduler.py", 4622, "run_scheduler_process", "scheduler = Scheduler("),
            (f"{_SRT}/managers/scheduler.py", 398, "__init__", "self.init_model_worker()"),
            (f"{_SRT}/managers/tp_worker.py", 259, "__init__", "self._init_model_runner()"),
            (f"{_SRT}/model_executor/model_runner.py", 377, "__init__", "self.init_torch_distributed()"),
            (f"{_SRT}/distributed/bootstrap.py", 89, "init_torch_distributed", "_init_parallel_groups("),
            (
                f"{_SRT}/distributed/parallel_state.py",
                2062,
                "init_distributed_environment",
                "torch.distributed.init_process_group(",
            ),
            (f"{_PKG}/torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
            (
                f"{_PKG}/torch/distributed/distributed_c10d.py",
                1750,
                "init_process_group",
                "store, rank, world_size = next(rendezvous_iterator)",
            ),
            (f"{_PKG}/torch/distributed/rendezvous.py", 204, "_tcp_rendezvous_handler", "store = _create_c10d_store("),
            (f"{_PKG}/torch/distributed/rendezvous.py", 180, "_create_c10d_store", "return TCPStore("),
        ]
    )
    if error.startswith("Invalid"):
        kind = "ValueError"
    else:
        kind = "torch.distributed." + ("DistStoreError" if store_side else "DistNetworkError")
    return f"Scheduler hit an exception: Traceback (most recent call last):\n{frames}{kind}: {error}\n"


def check_args_traceback(message: str) -> str:
    """The main process's traceback when `ServerArgs.check_server_args` refuses the arguments."""
    frames = _frames(
        [
            (f"{_PKG}/sglang/launch_server.py", 29, "<module>", "launch_server(server_args)"),
            (f"{_SRT}/entrypoints/http_server.py", 2678, "launch_server", ") = Engine._launch_subprocesses("),
            (f"{_SRT}/entrypoints/engine.py", 790, "_launch_subprocesses", "server_args.check_server_args()"),
            (f"{_SRT}/server_args.py", 7577, "check_server_args", "assert ("),
        ]
    )
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n' + frames + f"AssertionError: {message}\n"
    )


def worker_lifespan_traceback() -> str:
    """A node >= 1 after its schedulers ended: 0.5.16 goes on to start the HTTP app with no tokenizer
    manager, and the app's lifespan fails on it (uvicorn logs this at ERROR, then exits 3)."""
    frames = _frames(
        [
            (f"{_PKG}/starlette/routing.py", 694, "lifespan", "async with self.lifespan_context(app) as maybe_state:"),
            ("/usr/lib/python3.12/contextlib.py", 210, "__aenter__", "return await anext(self.gen)"),
            (
                f"{_SRT}/entrypoints/http_server.py",
                299,
                "lifespan",
                "fast_api_app.state.openai_serving_completion = OpenAIServingCompletion(",
            ),
            (
                f"{_SRT}/entrypoints/openai/serving_completions.py",
                51,
                "__init__",
                "super().__init__(tokenizer_manager)",
            ),
            (
                f"{_SRT}/entrypoints/openai/serving_base.py",
                35,
                "__init__",
                "if isinstance(self.tokenizer_manager.server_args, ServerArgs)",
            ),
        ]
    )
    return (
        "Traceback (most recent call last):\n"
        + frames
        + "AttributeError: 'NoneType' object has no attribute 'server_args'\n"
    )


def worker_ready_traceback(error: str) -> str:
    """The main process's traceback when `_wait_for_scheduler_ready` raises (0.5.16 `engine.py`)."""
    frames = _frames(
        [
            (f"{_PKG}/sglang/launch_server.py", 29, "<module>", "launch_server(server_args)"),
            (f"{_SRT}/entrypoints/http_server.py", 2678, "launch_server", ") = Engine._launch_subprocesses("),
            (f"{_SRT}/entrypoints/engine.py", 839, "_launch_subprocesses", "scheduler_init_result.wait_for_ready()"),
            (
                f"{_SRT}/entrypoints/engine.py",
                682,
                "wait_for_ready",
                "infos = _wait_for_scheduler_ready(scheduler_pipe_readers, scheduler_procs)",
            ),
            (
                f"{_SRT}/entrypoints/engine.py",
                1396,
                "_wait_for_scheduler_ready",
                "raise _scheduler_died_error(j, scheduler_procs[j])",
            ),
        ]
    )
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n' + frames + f"RuntimeError: {error}\n"
    )


def gloo_traceback(error: str) -> str:
    """A scheduler's record when the memory profile's CPU-group all-reduce loses a peer (gloo)."""
    frames = _frames(
        [
            (f"{_SRT}/managers/scheduler.py", 4622, "run_scheduler_process", "scheduler = Scheduler("),
            (f"{_SRT}/managers/scheduler.py", 398, "__init__", "self.init_model_worker()"),
            (f"{_SRT}/managers/tp_worker.py", 259, "__init__", "self._init_model_runner()"),
            (f"{_SRT}/model_executor/model_runner.py", 420, "initialize", "self.init_memory_pool(min_per_gpu_memory)"),
            (f"{_SRT}/utils/common.py", 512, "get_available_gpu_memory", "torch.distributed.all_reduce("),
            (f"{_PKG}/torch/distributed/c10d_logger.py", 83, "wrapper", "return func(*args, **kwargs)"),
            (f"{_PKG}/torch/distributed/distributed_c10d.py", 2943, "all_reduce", "work.wait()"),
        ]
    )
    return f"Scheduler hit an exception: Traceback (most recent call last):\n{frames}RuntimeError: {error}\n"
