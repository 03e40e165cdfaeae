"""The resolved `ServerArgs` as SGLang logs it at start and returns it from /get_server_info."""

from __future__ import annotations

import zlib

from supervisor.simulator.argv import SimArgs
from supervisor.simulator.modelcard import ModelFacts
from supervisor.simulator.sglang.crashes import PKG

Value = str | int | float | bool | None

# `python -m sglang.launch_server`: 0.5.16 warns first (launch_server.py, under __main__)
ENTRYPOINT_WARNING = (
    f"{PKG}/sglang/launch_server.py:56: UserWarning: 'python -m sglang.launch_server' is still "
    "supported, but 'sglang serve' is the recommended entrypoint.\n"
    "  Example: sglang serve --model-path <model> [options]\n"
    "  warnings.warn(\n"
)


def server_args_items(args: SimArgs, facts: ModelFacts) -> list[tuple[str, Value]]:
    """A representative subset of SGLang's fields, in its order, defaults resolved as its __post_init__ does."""
    spec = args.speculative
    seed = args.random_seed if args.random_seed is not None else zlib.crc32(str(args.port).encode()) % (1 << 30)
    items: list[tuple[str, Value]] = [
        ("model_path", args.model_path),
        ("tokenizer_path", args.tokenizer_path),
        ("tokenizer_mode", "auto"),
        ("tokenizer_worker_num", 1),
        ("skip_tokenizer_init", False),
        ("load_format", args.load_format),
        ("model_loader_extra_config", "{}"),
        ("trust_remote_code", args.trust_remote_code),
        ("context_length", args.context_length),
        ("is_embedding", False),
        ("enable_multimodal", None),
        ("revision", None),
        ("model_impl", "auto"),
        ("host", args.host),
        ("port", args.port),
        ("skip_server_warmup", args.skip_server_warmup),
        ("warmups", None),
        ("nccl_port", None),
        ("dtype", args.dtype),
        ("quantization", None),
        ("quantization_param_path", None),
        ("kv_cache_dtype", args.kv_cache_dtype),
        ("mem_fraction_static", args.mem_fraction_static if args.mem_fraction_static is not None else 0.88),
        ("max_running_requests", args.max_running_requests),
        ("max_queued_requests", None),
        ("max_total_tokens", None),
        ("chunked_prefill_size", facts.chunked_prefill_size),
        ("max_prefill_tokens", facts.max_prefill_tokens),
        ("schedule_policy", "fcfs"),
        ("schedule_conservativeness", 1.0),
        ("page_size", 1),
        ("device", "cuda"),
        ("tp_size", args.tp_size),
        ("pp_size", 1),
        ("stream_interval", 1),
        ("random_seed", seed),
        ("watchdog_timeout", args.watchdog_timeout),
        ("dist_timeout", args.dist_timeout),
        ("download_dir", None),
        ("base_gpu_id", 0),
        ("gpu_id_step", 1),
        ("sleep_on_idle", False),
        ("log_level", args.log_level),
        ("log_level_http", None),
        ("log_requests", False),
        ("log_requests_level", 2),
        ("crash_dump_folder", None),
        ("show_time_cost", False),
        ("enable_metrics", args.enable_metrics),
        ("enable_metrics_for_all_schedulers", False),
        ("decode_log_interval", args.decode_log_interval),
        ("api_key", None),
        ("served_model_name", args.served_model_name),
        ("weight_version", "default"),
        ("chat_template", None),
        ("dp_size", args.dp_size),
        ("load_balance_method", "round_robin"),
        ("dist_init_addr", args.dist_init_addr),
        ("nnodes", args.nnodes),
        ("node_rank", args.node_rank),
        ("attention_backend", args.attention_backend or "fa3"),
        ("sampling_backend", "flashinfer"),
        ("grammar_backend", "xgrammar"),
        ("speculative_algorithm", args.speculative_algorithm),
        ("speculative_draft_model_path", args.speculative_draft_model_path),
        ("speculative_num_steps", args.num_steps if spec else None),
        ("speculative_eagle_topk", (args.speculative_eagle_topk or 1) if spec else None),
        ("speculative_num_draft_tokens", args.num_draft_tokens if spec else None),
        ("speculative_accept_threshold_single", 1.0),
        ("speculative_accept_threshold_acc", 1.0),
        ("ep_size", 1),
        ("enable_hierarchical_cache", False),
        ("cuda_graph_max_bs_decode", args.cuda_graph_max_bs if args.cuda_graph_max_bs is not None else 160),
        ("cuda_graph_bs_decode", None),
        ("disable_cuda_graph", args.disable_cuda_graph),
        ("disable_cuda_graph_padding", False),
        ("enable_nccl_nvls", False),
        ("disable_custom_all_reduce", args.disable_custom_all_reduce),
        ("enable_mscclpp", False),
        ("disable_overlap_schedule", False),
        ("enable_mixed_chunk", False),
        ("enable_dp_attention", False),
        ("enable_torch_compile", False),
        ("torch_compile_max_bs", 32),
        ("enable_p2p_check", False),
        ("triton_attention_num_kv_splits", 8),
        ("num_continuous_decode_steps", 1),
        ("delete_ckpt_after_loading", False),
        ("enable_memory_saver", False),
        ("allow_auto_truncate", False),
        ("scheduler_recv_interval", 1),
        ("disaggregation_mode", "null"),
    ]
    if args.cuda_graph_backend_decode is not None:
        items.append(("cuda_graph_backend_decode", args.cuda_graph_backend_decode))
    if not args.prefill_cuda_graph:
        items.append(("cuda_graph_backend_prefill", "disabled"))
    known = {name for name, _ in items} | set(DEPRECATED_FLAGS)
    for name, value in args.extra:
        field = name.replace("-", "_")
        if field not in known:
            known.add(field)
            items.append((field, value))
    return items


# SGLang 0.5.16's deprecated spellings (server_args.py) -> what to use instead; each one given
# prints a warning while the arguments parse, before logging is configured (so no timestamp).
DEPRECATED_FLAGS = {
    "cuda_graph_max_bs": "--cuda-graph-max-bs-decode",
    "cuda_graph_bs": "--cuda-graph-bs-decode",
    "disable_cuda_graph": "--cuda-graph-backend-{decode,prefill}=disabled",
    "disable_piecewise_cuda_graph": "--cuda-graph-backend-prefill=disabled",
    "enable_breakable_cuda_graph": "--cuda-graph-backend-prefill=breakable",
}


def deprecation_warnings(argv: list[str]) -> list[str]:
    """`print_deprecated_warning` (arg_groups/argparse_actions.py): yellow, bare, in argv order."""
    out = []
    for arg in argv:
        flag = arg.split("=", 1)[0]
        new = DEPRECATED_FLAGS.get(flag.lstrip("-").replace("-", "_")) if flag.startswith("--") else None
        if new is not None:
            message = f"'{flag}' is deprecated and will be removed in a future release. Use '{new}' instead."
            out.append(f"\033[1;33m{message}\033[0m")
    return out


def server_args_line(args: SimArgs, facts: ModelFacts) -> str:
    body = ", ".join(f"{name}={value!r}" for name, value in server_args_items(args, facts))
    return f"server_args=ServerArgs({body})"
