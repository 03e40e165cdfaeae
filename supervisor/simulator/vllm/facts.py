"""The figures a vLLM start-up prints, derived from the command line (and `config.json` when the model
is a directory), so one command line always prints the same numbers.

The defaults are vLLM 0.26.0's on an H200-class GPU: `max_num_batched_tokens` 8192 and `max_num_seqs`
1024 for the API server (engine/arg_utils.py:2460-2469), CUDA-graph sizes `[1, 2, 4] + range(8, 256, 8)
+ range(256, max + 1, 16)` with `max = min(max_num_seqs * (1 + k) * 2, 512, max_num_batched_tokens)`
(config/vllm.py:1739-1798), the compile range `(1, max_num_batched_tokens)` (config/utils.py:395), and
which model runner a model gets (config/vllm.py:550-591: V2 for dense models and a few listed MoE
ones, unless ngram speculation or pipeline-parallel EAGLE-3 needs V1).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.simulator.modelcard import _architecture, _config, shard_files
from supervisor.simulator.vllm.argv import VllmArgs

GPU_TOTAL_GIB = 139.81  # an H200 as torch.cuda.mem_get_info reports it
DEFAULT_ARCHITECTURE = "LlamaForCausalLM"
DENSE_MODEL_GIB = 14.99  # Llama-3.1-8B in bf16
MOE_MODEL_GIB = 509.44  # the seed incident's 547 GB checkpoint
DEFAULT_MAX_MODEL_LEN = 131072
KV_BYTES_PER_TOKEN = 131072  # 32 layers x 8 KV heads x 128 x (K, V) x 2 bytes
BLOCK_SIZE = 16
ACTIVATION_GIB = 1.21  # the profile run's peak activations
NON_TORCH_GIB = 0.62  # NCCL buffers and the CUDA context
GRAPH_GIB = 0.52
# config/vllm.py:68-77: MoE architectures that get the V2 model runner by default anyway
DEFAULT_V2_MOE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)
_MOE_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_intermediate_size")
V2_SPEC_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")  # config/vllm.py:2154-2165


@dataclass(frozen=True)
class VllmFacts:
    architecture: str
    is_moe: bool
    v2_runner: bool
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_shards: int
    weights_gib: float  # per rank
    draft_gib: float
    available_kv_gib: float
    kv_tokens: int
    capture_sizes: tuple[int, ...]
    full_sizes: tuple[int, ...]  # FULL (uniform decode) graphs
    graph_gib: float

    @property
    def llama(self) -> bool:
        return self.architecture.startswith("Llama")

    @property
    def compile_range(self) -> str:
        return f"(1, {self.max_num_batched_tokens})"

    @property
    def max_concurrency(self) -> float:
        return self.kv_tokens / self.max_model_len


def capture_sizes(max_num_seqs: int, max_tokens: int, spec_tokens: int) -> tuple[int, ...]:
    limit = min(max_num_seqs * (1 + spec_tokens) * 2, 512, max_tokens)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, limit + 1, 16)]
    return tuple(s for s in sizes if s <= limit)


def _is_moe(config: dict[str, object], architecture: str) -> bool:
    if any(key in config for key in _MOE_KEYS):
        return True
    return any(tag in architecture for tag in ("Moe", "MoE", "Deepseek", "Mixtral", "Kimi"))


def uses_v2_runner(args: VllmArgs, architecture: str, is_moe: bool) -> bool:
    if is_moe and architecture not in DEFAULT_V2_MOE:
        return False
    spec = args.speculative
    if spec is not None and spec.method not in V2_SPEC_METHODS:
        return False  # "ngram/ngram_gpu speculative decoding" is not supported by the V2 runner
    return not (spec is not None and spec.method == "eagle3" and args.pp > 1)


def vllm_facts(args: VllmArgs) -> VllmFacts:
    config = _config(args.model)
    architecture = _architecture(config, DEFAULT_ARCHITECTURE)
    is_moe = _is_moe(config, architecture)
    raw_len = config.get("max_position_embeddings")
    max_model_len = args.max_model_len or (raw_len if isinstance(raw_len, int) else DEFAULT_MAX_MODEL_LEN)
    seqs = args.max_num_seqs or 1024
    tokens = args.max_num_batched_tokens or 8192
    total_gib = MOE_MODEL_GIB if is_moe else DENSE_MODEL_GIB
    weights = round(total_gib / args.world_size, 2)
    spec = args.speculative
    draft = 0.92 if spec is not None and spec.method != "ngram" else 0.0
    graphs = GRAPH_GIB if args.cuda_graphs else 0.0
    requested = GPU_TOTAL_GIB * args.gpu_memory_utilization
    available = max(0.5, requested - weights - draft - ACTIVATION_GIB - NON_TORCH_GIB - graphs)
    per_token = KV_BYTES_PER_TOKEN / args.tp
    blocks = int(available * (1 << 30) / per_token) // BLOCK_SIZE
    k = spec.num_speculative_tokens if spec is not None else 0
    sizes = capture_sizes(seqs, tokens, k) if args.cuda_graphs else ()
    full = tuple(s for s in sizes if s % (1 + k) == 0)
    return VllmFacts(
        architecture=architecture,
        is_moe=is_moe,
        v2_runner=uses_v2_runner(args, architecture, is_moe),
        max_model_len=max_model_len,
        max_num_seqs=seqs,
        max_num_batched_tokens=tokens,
        num_shards=len(shard_files(args.model)) or (4 if not is_moe else 64),
        weights_gib=weights,
        draft_gib=draft,
        available_kv_gib=round(available, 2),
        kv_tokens=blocks * BLOCK_SIZE,
        capture_sizes=sizes,
        full_sizes=full,
        graph_gib=graphs,
    )
