"""SGLang's command line, as far as the simulator needs it; anything else is recorded and ignored."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SimArgs:
    model_path: str
    tokenizer_path: str
    served_model_name: str
    tp_size: int
    dp_size: int
    host: str
    port: int
    speculative_algorithm: str | None
    speculative_draft_model_path: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    enable_metrics: bool
    disable_cuda_graph: bool
    disable_piecewise_cuda_graph: bool
    cuda_graph_max_bs: int | None
    cuda_graph_backend_decode: str | None
    cuda_graph_backend_prefill: str | None
    disable_custom_all_reduce: bool
    attention_backend: str | None
    mem_fraction_static: float | None
    dist_timeout: int | None
    watchdog_timeout: float
    skip_server_warmup: bool
    load_format: str
    decode_log_interval: int
    context_length: int | None
    chunked_prefill_size: int | None
    max_running_requests: int | None
    dtype: str
    kv_cache_dtype: str
    trust_remote_code: bool
    log_level: str
    random_seed: int | None
    nnodes: int  # --nnodes: nodes of one TP group, each running its own launch_server
    node_rank: int  # --node-rank
    dist_init_addr: str | None  # --dist-init-addr HOST:PORT: node 0's rendezvous (torch's TCPStore)
    # Flags SGLang has and the simulator does not model, in command-line order: (name, value).
    extra: tuple[tuple[str, str | bool], ...]
    unknown_flags: tuple[str, ...]

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm)

    @property
    def cuda_graph(self) -> bool:
        return not self.disable_cuda_graph and self.cuda_graph_backend_decode != "disabled"

    @property
    def prefill_cuda_graph(self) -> bool:
        """SGLang 0.5.16 captures a piecewise prefill graph by default, after the decode graph."""
        return (
            self.cuda_graph and not self.disable_piecewise_cuda_graph and self.cuda_graph_backend_prefill != "disabled"
        )

    @property
    def num_steps(self) -> int:
        return self.speculative_num_steps or 3

    @property
    def num_draft_tokens(self) -> int:
        return self.speculative_num_draft_tokens or self.num_steps + 1


def _parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: an unknown `--disable-cuda` must stay unknown, not match a known flag.
    p = argparse.ArgumentParser(prog="launch_server.py", allow_abbrev=False)
    p.add_argument("--model-path", "--model", dest="model_path", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--tp-size", "--tp", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", dest="dp_size", type=int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--disable-cuda-graph", action="store_true")
    p.add_argument("--disable-piecewise-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None)
    p.add_argument("--cuda-graph-backend-decode", default=None)
    p.add_argument("--cuda-graph-backend-prefill", default=None)
    p.add_argument("--disable-custom-all-reduce", action="store_true")
    p.add_argument("--attention-backend", default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--dist-timeout", type=int, default=None)
    p.add_argument("--watchdog-timeout", type=float, default=300.0)
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--decode-log-interval", type=int, default=40)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--log-level", default="info")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", default=None)
    return p


def split_unknown(rest: Sequence[str]) -> tuple[tuple[str, str | bool], ...]:
    """`--flag value`, `--flag=value` and bare `--flag` from argparse's leftovers, in order."""
    out: list[tuple[str, str | bool]] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        i += 1
        if not arg.startswith("--") or len(arg) == 2:
            continue  # a stray positional: SGLang would refuse it, the simulator ignores it
        name, eq, value = arg[2:].partition("=")
        if eq:
            out.append((name, value))
        elif i < len(rest) and not rest[i].startswith("--"):
            out.append((name, rest[i]))
            i += 1
        else:
            out.append((name, True))
    return tuple(out)


def parse_args(argv: Sequence[str]) -> SimArgs:
    """Parse like SGLang; a missing --model-path exits 2 with argparse's usage message, as SGLang does."""
    ns, rest = _parser().parse_known_args(list(argv))
    extra = split_unknown(rest)
    tp = max(1, ns.tp_size)
    interval = ns.decode_log_interval if ns.decode_log_interval > 0 else 40
    return SimArgs(
        model_path=ns.model_path,
        tokenizer_path=ns.tokenizer_path or ns.model_path,
        served_model_name=ns.served_model_name or ns.model_path,
        tp_size=tp,
        dp_size=max(1, ns.dp_size),
        host=ns.host,
        port=ns.port,
        speculative_algorithm=ns.speculative_algorithm,
        speculative_draft_model_path=ns.speculative_draft_model_path,
        speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk,
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        enable_metrics=ns.enable_metrics,
        disable_cuda_graph=ns.disable_cuda_graph,
        disable_piecewise_cuda_graph=ns.disable_piecewise_cuda_graph,
        cuda_graph_max_bs=ns.cuda_graph_max_bs,
        cuda_graph_backend_decode=ns.cuda_graph_backend_decode,
        cuda_graph_backend_prefill=ns.cuda_graph_backend_prefill,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
        attention_backend=ns.attention_backend,
        mem_fraction_static=ns.mem_fraction_static,
        dist_timeout=ns.dist_timeout,
        watchdog_timeout=ns.watchdog_timeout,
        skip_server_warmup=ns.skip_server_warmup,
        load_format=ns.load_format,
        decode_log_interval=interval,
        context_length=ns.context_length,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_running_requests=ns.max_running_requests,
        dtype=ns.dtype,
        kv_cache_dtype=ns.kv_cache_dtype,
        trust_remote_code=ns.trust_remote_code,
        log_level=ns.log_level,
        random_seed=ns.random_seed,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        dist_init_addr=ns.dist_init_addr,
        extra=extra,
        unknown_flags=tuple(rest),
    )
