"""The numbers a real start-up would print: model class, memory per rank, KV cache, graph batch sizes.

Derived only from the command line and, when `--model-path` is a directory, its `config.json` and
`*.safetensors` names, so one command line always prints the same figures.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from supervisor.simulator.argv import SimArgs

GPU_TOTAL_GB = 139.72  # an H200 as torch reports it
AVAIL_AT_START_GB = 139.33
DIST_INIT_GB = 0.12
MODEL_TOTAL_GB = 547.0  # the seed incident's checkpoint, split over the TP ranks
DRAFT_GB = 1.87
GRAPH_GB = 1.21
DRAFT_GRAPH_GB = 0.38
BYTES_PER_TOKEN = 70272  # MLA: 61 layers x 576 x 2 bytes
DEFAULT_SHARDS = 8
DEFAULT_CONTEXT = 163840
_DRAFT_CLASSES = {
    "EAGLE3": "LlamaForCausalLMEagle3",
    "EAGLE": "LlamaForCausalLMEagle",
    "NEXTN": "DeepseekV3ForCausalLMNextN",
    "MTP": "DeepseekV3ForCausalLMNextN",
}

# What the simulated model says, one word a token, over and over (both engines' detokenizers).
WORDS = (
    " Paris", " is", " the", " capital", " of", " France", ".", " It", " has", " a", " population",
    " of", " about", " two", " million", " people", ",", " and", " is", " known", " for", " its",
    " museums", " and", " cafes",
)


def _config(path: str | None) -> dict[str, object]:
    if not path:
        return {}
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _architecture(config: dict[str, object], default: str) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return default


def shard_files(model_path: str) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(model_path) if n.endswith(".safetensors"))
    except OSError:
        return []
    return [os.path.join(model_path, n) for n in names]


def capture_batch_sizes(max_bs: int | None) -> list[int]:
    """SGLang's default capture list, largest first as its capture loop walks it."""
    sizes = [1, 2, 4, 8, *range(16, 257, 8)]
    limit = max_bs if max_bs is not None else 160
    kept = [bs for bs in sizes if bs <= limit] or [1]
    return list(reversed(kept))


@dataclass(frozen=True)
class ModelFacts:
    architecture: str
    draft_architecture: str | None
    context_len: int
    num_shards: int
    weight_gb: float
    draft_gb: float
    kv_tokens: int
    kv_k_gb: float
    graph_gb: float
    capture_bs: tuple[int, ...]
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int

    # Available memory after each stage, as the start-up lines print it.
    @property
    def avail_after_dist(self) -> float:
        return AVAIL_AT_START_GB - DIST_INIT_GB

    @property
    def avail_after_weights(self) -> float:
        return self.avail_after_dist - self.weight_gb

    @property
    def avail_after_draft(self) -> float:
        return self.avail_after_weights - self.draft_gb

    @property
    def avail_after_kv(self) -> float:
        return self.avail_after_draft - 2 * self.kv_k_gb

    @property
    def avail_after_graphs(self) -> float:
        return self.avail_after_kv - self.graph_gb


def model_facts(args: SimArgs) -> ModelFacts:
    config = _config(args.model_path)
    shards = shard_files(args.model_path)
    weight_gb = round(min(MODEL_TOTAL_GB / args.tp_size, 0.55 * AVAIL_AT_START_GB), 2)
    draft_gb = DRAFT_GB if args.speculative else 0.0
    draft_arch = None
    if args.speculative:
        algo = (args.speculative_algorithm or "").upper()
        default_draft = _DRAFT_CLASSES.get(algo, "LlamaForCausalLMEagle3")
        draft_arch = _architecture(_config(args.speculative_draft_model_path), default_draft)
    fraction = args.mem_fraction_static if args.mem_fraction_static is not None else 0.88
    kv_total = max(1.0, AVAIL_AT_START_GB * fraction - weight_gb - draft_gb - DIST_INIT_GB)
    kv_tokens = int(kv_total * (1 << 30) / BYTES_PER_TOKEN)
    raw_context = config.get("max_position_embeddings")
    context = args.context_length or (raw_context if isinstance(raw_context, int) else DEFAULT_CONTEXT)
    graph_gb = round(GRAPH_GB + (DRAFT_GRAPH_GB if args.speculative else 0.0), 2) if args.cuda_graph else 0.0
    return ModelFacts(
        architecture=_architecture(config, "DeepseekV3ForCausalLM"),
        draft_architecture=draft_arch,
        context_len=context,
        num_shards=len(shards) or DEFAULT_SHARDS,
        weight_gb=weight_gb,
        draft_gb=draft_gb,
        kv_tokens=kv_tokens,
        kv_k_gb=round(kv_total / 2, 2),
        graph_gb=graph_gb,
        capture_bs=tuple(capture_batch_sizes(args.cuda_graph_max_bs)),
        chunked_prefill_size=args.chunked_prefill_size or 8192,
        max_prefill_tokens=16384,
        max_running_requests=args.max_running_requests or min(4096, max(1, kv_tokens // 256)),
    )
