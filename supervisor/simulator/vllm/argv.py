"""`vllm serve`'s command line (vLLM 0.26.0), as far as the simulator needs it; anything else is recorded.

The flags and defaults are vLLM's: entrypoints/openai/cli_args.py:339-383 (`model_tag`, `--headless`,
`--api-server-count`, then FrontendArgs and AsyncEngineArgs), engine/arg_utils.py (the engine's
groups: `--tensor-parallel-size/-tp` :1014, `--pipeline-parallel-size/-pp` :976, `--data-parallel-size/-dp`
:1039, `--master-addr/--master-port/--nnodes -n/--node-rank -r` :980-983, `--speculative-config/-sc` :1539
(JSON), `--compilation-config/-cc` :1559, `--disable-log-stats` :1583, ...). vLLM's parser takes
`--snake_case` spellings too (utils/argparse_utils.py FlexibleArgumentParser), so they are folded.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass

from supervisor.simulator.argv import split_unknown

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # engine/arg_utils.py: EngineArgs.model, when neither model_tag nor --model is given


@dataclass(frozen=True)
class SpecConfig:
    """`--speculative-config '{"method": "eagle3", "model": ..., "num_speculative_tokens": 3}'`."""

    method: str
    model: str | None
    num_speculative_tokens: int


@dataclass(frozen=True)
class VllmArgs:
    model: str
    served_model_name: str  # the first of --served-model-name, else the model (api_server.py:412-415)
    tp: int
    pp: int
    dp: int
    speculative: SpecConfig | None
    enforce_eager: bool
    compilation_config: str | None  # as given (JSON or an optimization level)
    gpu_memory_utilization: float
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    disable_log_stats: bool
    host: str | None
    port: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    api_server_count: int | None
    disable_uvicorn_access_log: bool
    enable_log_requests: bool
    seed: int
    # `non-default args` as vLLM logs them (api_utils.py:209-219): parser order, values as parsed.
    non_default: tuple[tuple[str, object], ...]
    extra: tuple[tuple[str, str | bool], ...]  # flags vLLM has and the simulator does not model
    unknown_flags: tuple[str, ...]

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    @property
    def local_world_size(self) -> int:
        """ParallelConfig.local_world_size: the ranks of one node (world_size // nnodes_within_dp)."""
        return max(1, self.world_size // max(1, self.nnodes))

    @property
    def multinode(self) -> bool:
        return self.nnodes > 1

    def _compilation(self) -> dict[str, object]:
        raw = (self.compilation_config or "").strip()
        if raw.isdigit():  # `-cc 3` / `-O3`-style: an optimization level
            return {"mode": int(raw)}
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    @property
    def cuda_graphs(self) -> bool:
        """`--enforce-eager` turns CUDA graphs off (config/vllm.py:1162-1167), as `-cc.cudagraph_mode=none` does."""
        return not self.enforce_eager and str(self._compilation().get("cudagraph_mode", "")).lower() != "none"

    @property
    def torch_compile(self) -> bool:
        """vLLM's own torch.compile (CompilationMode.VLLM_COMPILE, 3) unless eager or another mode was asked."""
        mode = self._compilation().get("mode", self._compilation().get("level", 3))
        return not self.enforce_eager and mode in (3, "3", "VLLM_COMPILE")


def _max_model_len(raw: str) -> int:
    """vLLM accepts `32768`, `32k`, `1m` (engine/arg_utils.py human_readable_int)."""
    text = raw.strip().lower()
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3}.get(text[-1:], 0)
    return int(float(text[:-1]) * scale) if scale else int(text)


def _speculative(raw: str | None) -> SpecConfig | None:
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        raise SystemExit(f"argument --speculative-config/-sc: invalid loads value: '{raw}'") from None
    if not isinstance(data, dict):
        return None
    method = str(data.get("method") or ("eagle3" if "eagle3" in str(data.get("model", "")).lower() else "eagle"))
    tokens = data.get("num_speculative_tokens")
    return SpecConfig(method, data.get("model"), int(tokens) if isinstance(tokens, int) else 3)


def _parser() -> argparse.ArgumentParser:
    """Known flags in the order vLLM's parser adds them (cli_args.py, then arg_utils.py's groups)."""
    p = argparse.ArgumentParser(prog="vllm serve", allow_abbrev=False)
    p.add_argument("model_tag", nargs="?", default=None)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--api-server-count", "-asc", type=int, default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--uvicorn-log-level", default="info")
    p.add_argument("--disable-uvicorn-access-log", action="store_true")
    p.add_argument("--enable-log-requests", action="store_true")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=_max_model_len, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--distributed-executor-backend", default=None)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=29501)
    p.add_argument("--nnodes", "-n", type=int, default=1)
    p.add_argument("--node-rank", "-r", type=int, default=0)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--speculative-config", "-sc", default=None)
    p.add_argument("--compilation-config", "-cc", default=None)
    p.add_argument("--disable-log-stats", action="store_true")
    return p


def fold_underscores(argv: Sequence[str]) -> list[str]:
    out = []
    for arg in argv:
        if arg.startswith("--"):
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out


def _shown(dest: str, value: object) -> object:
    if dest == "speculative_config" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _split_known(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """The flags the parser knows, and the others with their values (so that an unknown flag's value is
    never taken for the positional model)."""
    known_flags = set(parser._option_string_actions)
    known: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("-") or arg.split("=", 1)[0] in known_flags or arg == "-":
            known.append(arg)
            continue
        rest.append(arg)
        if "=" not in arg and i < len(argv) and not argv[i].startswith("-"):
            rest.append(argv[i])
            i += 1
    return known, rest


def parse_vllm_args(argv: Sequence[str]) -> VllmArgs:
    parser = _parser()
    known, rest = _split_known(parser, fold_underscores(argv))
    ns, more = parser.parse_known_args(known)
    rest += more
    defaults = vars(parser.parse_args([]))
    model = ns.model_tag or ns.model  # serve.py:51-52: the positional model wins
    ns.model = model
    extra = split_unknown(rest)
    non_default = [(k, _shown(k, v)) for k, v in vars(ns).items() if defaults.get(k) != v]
    non_default += [(name.replace("-", "_"), value) for name, value in extra]
    served = ns.served_model_name[0] if ns.served_model_name else model
    return VllmArgs(
        model=model,
        served_model_name=served,
        tp=max(1, ns.tensor_parallel_size),
        pp=max(1, ns.pipeline_parallel_size),
        dp=max(1, ns.data_parallel_size),
        speculative=_speculative(ns.speculative_config),
        enforce_eager=ns.enforce_eager,
        compilation_config=ns.compilation_config,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_model_len=ns.max_model_len,
        max_num_seqs=ns.max_num_seqs,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        disable_log_stats=ns.disable_log_stats,
        host=ns.host,
        port=ns.port,
        nnodes=max(1, ns.nnodes),
        node_rank=max(0, ns.node_rank),
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=ns.headless,
        api_server_count=ns.api_server_count,
        disable_uvicorn_access_log=ns.disable_uvicorn_access_log,
        enable_log_requests=ns.enable_log_requests,
        seed=ns.seed,
        non_default=tuple(non_default),
        extra=extra,
        unknown_flags=tuple(rest),
    )
