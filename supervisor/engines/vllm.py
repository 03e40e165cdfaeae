"""vLLM 0.26.0 (the release whose wheel pins the device's torch 2.11), read from its source; the file
and line of each string are in docs/ENGINES.md."""

from __future__ import annotations

from supervisor.engines.profile import EngineProfile, Flags, LogGrammar, MetricNames, Titles

VLLM = EngineProfile(
    name="vllm",
    label="vLLM",
    # `vllm serve` is the same parser; the module form keeps the interpreter first, so check-config
    # can run vLLM's parser with it (as it does SGLang's).
    default_command=("python3", "-m", "vllm.entrypoints.openai.api_server"),
    log=LogGrammar(
        prefix="level",
        milestones=(
            ("Initializing a V1 LLM engine", "dist_init"),  # v1/engine/core.py
            ("Loading drafter model", "draft_begin"),  # v1/worker/gpu_model_runner.py
            ("Starting to load model", "weights_begin"),  # the V1 model runner (MoE, ngram)
            ("Loading model from scratch", "weights_begin"),  # Model Runner V2, dense models' default
            ("Loading weights took", "weights_end"),  # model_loader/default_loader.py
            # Both models are in memory: what follows is vLLM's "profile, create kv cache" stage, first
            # silent (the profiling run), then the compile (v1/worker/gpu/model_runner.py:305).
            ("Model loading took", "kv_begin"),
            # The profiling run that sizes the KV cache compiles the model first (torch.compile):
            # vLLM's own name for the stage is "profile, create kv cache".
            ("Dynamo bytecode transform time", "kv_allocated"),  # compilation/backends.py
            ("Compiling a graph for compile range", "kv_allocated"),
            ("Directly load the compiled graph", "kv_allocated"),
            ("Available KV cache memory", "kv_allocated"),  # v1/worker/gpu_worker.py
            ("GPU KV cache size", "kv_allocated"),  # v1/core/kv_cache_utils.py
            # After capture, vLLM warms its kernels up (a full step and a sample: Triton and FlashInfer
            # JIT, 87 s cold on an H100, 2 s warm) before its port opens (v1/worker/gpu_worker.py:861).
            ("Graph capturing finished in", "warmup_begin"),  # model_runner.py:747, gpu_model_runner.py
            ("Starting vLLM server on", "http_up"),  # entrypoints/openai/api_server.py:677
            ("Application startup complete", "http_up"),  # uvicorn
        ),
        ready=(),  # vLLM prints no line after its port opens: ready is the port and a canary
        errors=(
            "EngineCore encountered a fatal error",
            "Engine core initialization failed",
            "died unexpectedly",  # `Worker proc VllmWorker-1 died unexpectedly (exit code: ...)`
            "No available shared memory broadcast block found",  # a rank waits on a hung peer
            "CUDA error",
            "CUDA out of memory",
            "OutOfMemoryError",
            "NCCL WARN",
            "NCCL error",
        ),
        health_failed="",
        stats="Avg prompt throughput",  # `Engine 000: Avg prompt throughput: ..., Running: N reqs, ...`
        # distributed/device_communicators/shm_broadcast.py:96, every VLLM_RINGBUFFER_WARNING_INTERVAL
        # (60 s) while a rank waits on the broadcast queue: a hung peer, or a long compile elsewhere.
        waiting=("No available shared memory broadcast block found",),
        draft_after_target=False,
    ),
    titles=Titles(
        # vllm/utils/system_utils.py set_process_title: f"{VLLM_PROCESS_NAME_PREFIX}::{name}", default "VLLM"
        prefix="VLLM::",
        rank=("VLLM::Worker",),  # `VLLM::Worker_TP0` (`_PP0_TP1`, `_DP0_...` with other parallelism)
        rank_when_alone=("VLLM::EngineCore",),
        detokenizer=(),
        controller=("VLLM::EngineCore", "VLLM::DPCoordinator", "VLLM::APIServer"),
    ),
    metrics=MetricNames(
        running="vllm:num_requests_running",
        queued="vllm:num_requests_waiting",
        generation_tokens="vllm:generation_tokens_total",
        step_tokens="vllm:iteration_tokens_total_sum",  # a histogram of tokens per engine step
        step_label=None,
        requests="vllm:request_success_total",
        throughput="",
        accept_length="",
        drafts="vllm:spec_decode_num_drafts_total",
        accepted_tokens="vllm:spec_decode_num_accepted_tokens_total",
        http_active="",
        replica_labels=frozenset({"pid"}),
        queue_time_count="vllm:request_queue_time_seconds_count",  # observed when the request ends
        first_token_count="vllm:time_to_first_token_seconds_count",
    ),
    flags=Flags(
        speculative=("speculative-config",),
        metrics_on=(),  # /metrics is always served
        metrics_off=("disable-log-stats",),  # no stat loggers: the gauges never move
        model=("model",),
        tp_size=("tensor-parallel-size", "tp"),
        nnodes="nnodes",
        node_rank="node-rank",
        rendezvous=("master-addr", "master-port"),
        # vLLM refuses to start when less than this fraction of the GPU is free (its default 0.9,
        # vllm/config/cache.py), so it is the need even unset.
        mem_fraction="gpu-memory-utilization",
        mem_fraction_default=0.9,
    ),
    health="flag",
    canary_path="/v1/completions",
    canary_body='{"prompt": [1], "max_tokens": 1, "temperature": 0}',
    shm_prefixes=(),  # vLLM's queues use Python's default `psm_` names: nothing proves a creator
    parser=(
        "from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "def make_parser():\n"
        "    return make_arg_parser(FlexibleArgumentParser(prog='vllm serve', exit_on_error=False))\n"
    ),
)
