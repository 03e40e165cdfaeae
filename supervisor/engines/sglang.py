"""SGLang 0.5.16, as ../shared/docs/SGLANG.md and REAL_SGLANG.md record it."""

from __future__ import annotations

from supervisor.engines.profile import EngineProfile, Flags, LogGrammar, MetricNames, Titles

SGLANG = EngineProfile(
    name="sglang",
    label="SGLang",
    default_command=("python3", "-m", "sglang.launch_server"),
    log=LogGrammar(
        prefix="bracket",
        milestones=(
            ("Init torch distributed begin", "dist_init"),
            ("Load weight begin", "weights_begin"),
            ("Load weight end", "weights_end"),
            ("KV Cache is allocated", "kv_allocated"),
            ("Memory pool end", "kv_allocated"),
            ("Capture draft decode CUDA graph begin", "draft_graph_begin"),
            ("Capture draft extend CUDA graph begin", "draft_graph_begin"),
            ("CUDA graph begin", "graph_begin"),
            ("cuda graph begin", "graph_begin"),
            ("Uvicorn running on", "http_up"),
            ("Application startup complete", "http_up"),
        ),
        ready=("The server is fired up and ready to roll",),
        errors=(
            "Capture cuda graph failed",
            "Initialization failed",
            "CUDA error",
            "CUDA out of memory",
            "OutOfMemoryError",
            "NCCL WARN",
            "NCCL error",
            "Health check failed",
            "Received sigquit from a child",  # the launch-phase SIGQUIT handler
            "SIGQUIT received",  # the running-phase handler (0.5.16)
            "Triggering SIGQUIT for cleanup",  # its subprocess-watchdog found a dead child (0.5.16)
            "watchdog timeout",
        ),
        health_failed="Health check failed",
        stats="Decode batch",
        waiting=(),
        draft_after_target=True,
    ),
    titles=Titles(
        prefix="sglang::",
        rank=("sglang::scheduler",),
        rank_when_alone=(),
        detokenizer=("sglang::detokenizer",),
        controller=("sglang::data_parallel_controller",),
    ),
    metrics=MetricNames(
        running="sglang:num_running_reqs",
        queued="sglang:num_queue_reqs",
        generation_tokens="sglang:generation_tokens_total",
        step_tokens="sglang:realtime_tokens_total",
        step_label=("mode", "decode"),
        requests="sglang:num_requests_total",
        throughput="sglang:gen_throughput",
        accept_length="sglang:spec_accept_length",
        drafts="",
        accepted_tokens="",
        http_active="sglang:http_requests_active",
        replica_labels=frozenset({"tp_rank", "moe_ep_rank", "pid"}),
        # 0.5.16 observability/metrics_collector.py:687 and :1631
        queue_time_count="sglang:queue_time_seconds_count",
        first_token_count="sglang:time_to_first_token_seconds_count",
    ),
    flags=Flags(
        speculative=("speculative-algorithm",),
        metrics_on=("enable-metrics",),
        metrics_off=(),
        model=("model-path", "model"),
        tp_size=("tp-size", "tp", "tensor-parallel-size"),
        nnodes="nnodes",
        node_rank="node-rank",
        rendezvous=("dist-init-addr",),
        mem_fraction="mem-fraction-static",
        mem_fraction_default=None,  # SGLang picks one from the GPU's size and the model
    ),
    health="generates",
    canary_path="",
    canary_body="",
    shm_prefixes=("sgl_shm_", "multi_tokenizer_args_"),
    parser=(
        "from sglang.srt.server_args import ServerArgs\n"
        "def make_parser():\n"
        "    p = argparse.ArgumentParser(prog='sglang.launch_server', exit_on_error=False)\n"
        "    ServerArgs.add_cli_args(p)\n"
        "    return p\n"
    ),
)
