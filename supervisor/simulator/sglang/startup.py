"""A scheduler's start-up, line by line as SGLang's rank prints it, with the start-up faults.

Every rank prints its own lines (prefix `TPn`); only rank 0 draws the progress bars, as in SGLang.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

from supervisor.simulator import hangs, kernelcache
from supervisor.simulator.argv import SimArgs
from supervisor.simulator.bars import SHARDS_FORMAT, Bar
from supervisor.simulator.gpu.kernel import SpinningKernel
from supervisor.simulator.links import Link
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.mirror.sglang.srt.speculative.eagle_draft_cuda_graph_runner import (
    EAGLEDraftCudaGraphRunner,
)
from supervisor.simulator.mirror.torch._inductor.compile_fx import compile_fx_inner
from supervisor.simulator.modelcard import DIST_INIT_GB, DRAFT_GRAPH_GB, ModelFacts, shard_files
from supervisor.simulator.ncclwait import barrier
from supervisor.simulator.nodes import node_layout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario, SimSettings
from supervisor.simulator.procutil import import_sglang
from supervisor.simulator.rendezvous import meet
from supervisor.simulator.sglang import crashes
from supervisor.simulator.weights import WeightReader

MB = 1024 * 1024
LOAD_RATE = 64 * MB  # bytes/s while loading normally (page cache or a fast disk)
SLOW_RATE = 2 * MB  # a slow network filesystem
QUIET_RATE = 8 * MB
# The piecewise prefill graph's 58 token counts (SGLang 0.5.16's default list, smallest first).
PREFILL_NUM_TOKENS = tuple([4 * i for i in range(1, 33)] + [160 + 32 * i for i in range(26)])


@dataclass(frozen=True)
class RankContext:
    rank: int
    args: SimArgs
    settings: SimSettings
    facts: ModelFacts
    main_pid: int


def _dtype(arg: str) -> str:
    return {"float16": "torch.float16", "half": "torch.float16", "float32": "torch.float32"}.get(
        arg, "torch.bfloat16"
    )


class Startup:
    def __init__(self, ctx: RankContext, log: LogWriter) -> None:
        self.ctx = ctx
        self.log = log
        self.pace = ctx.settings.pace
        self.scenario = ctx.settings.scenario
        self.reader = WeightReader(shard_files(ctx.args.model_path), ctx.args.model_path)
        self.links: list[Link] = []  # multi-node: the group's links from the rendezvous

    def run(self) -> WeightReader:
        """The whole start-up; returns the loaded "weights" (keep them alive). May never return."""
        self._init_distributed()
        self._load_target()
        if self.ctx.args.speculative:
            self._load_draft()
        self._allocate_kv()
        if self.ctx.args.cuda_graph:
            self._capture_graphs()
        else:
            self._group_sync()  # the first forward without graphs: an all-reduce with every rank
        facts = self.ctx.facts
        self.log.info(
            f"max_total_num_tokens={facts.kv_tokens}, chunked_prefill_size={facts.chunked_prefill_size}, "
            f"max_prefill_tokens={facts.max_prefill_tokens}, max_running_requests={facts.max_running_requests}, "
            f"context_len={facts.context_len}, available_gpu_mem={facts.avail_after_graphs:.2f} GB"
        )
        return self.reader

    def _bar_writer(self, text: str) -> None:
        self.log.raw(text)

    def _onset(self) -> None:
        # Every rank writes when it reaches the fault; the last replace wins, so the file holds the
        # moment the last rank made its last progress.
        s = self.ctx.settings
        flags = self.ctx.args.unknown_flags
        write_onset(s.onset_file, s.scenario.value, s.requested.value, self.ctx.main_pid, flags)

    def _group_sync(self, cpu_group: bool = False) -> None:
        """A collective of the start-up: on several nodes, a rank waits here for every other."""
        if self.links:
            barrier(self.links, self.ctx.rank, self.ctx.settings.gpu_file, cpu_group)

    def _init_distributed(self) -> None:
        self.log.info("Init torch distributed begin.")
        tic = time.monotonic()
        layout = node_layout(self.ctx.args)
        if layout.multinode:  # waits, silently, until every rank of every node has joined
            self.links = meet(layout, self.ctx.rank, self.ctx.args.host)
        time.sleep(0.5 * self.pace)
        self.log.info(
            f"Init torch distributed ends. elapsed={time.monotonic() - tic:.2f} s, mem usage={DIST_INIT_GB:.2f} GB"
        )

    def _load_target(self) -> None:
        facts = self.ctx.facts
        settings = self.ctx.settings
        self.log.info(f"Load weight begin. avail mem={facts.avail_after_dist:.2f} GB")
        tic = time.monotonic()
        if self.scenario is Scenario.SLOW_LOAD:
            self._onset()
        if self.scenario is Scenario.QUIET_LOAD:
            self._onset()
            self.reader.read_for(settings.quiet_seconds, QUIET_RATE, busy_fraction=0.4)
        slow = self.scenario is Scenario.SLOW_LOAD
        per_shard = int(settings.mem_mb * MB * 0.9 / facts.num_shards)
        bar = self._shard_bar(facts.num_shards)
        crash_at = max(1, facts.num_shards // 2)
        for shard in range(facts.num_shards):
            first = self.ctx.rank == node_layout(self.ctx.args).first_local  # rank 0, or a node's first
            if self.scenario is Scenario.CRASH_ON_LOAD and first and shard == crash_at:
                self._crash_oom()
            self.reader.read_for(settings.shard_seconds, SLOW_RATE if slow else LOAD_RATE, per_shard)
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        self.log.info(
            f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={facts.architecture}, "
            f"avail mem={facts.avail_after_weights:.2f} GB, mem usage={facts.weight_gb:.2f} GB."
        )

    def _shard_bar(self, total: int) -> Bar | None:
        if self.ctx.rank != 0:
            return None
        return Bar(total, self._bar_writer, desc="Multi-thread loading shards", bar_format=SHARDS_FORMAT)

    def _load_draft(self) -> None:
        facts = self.ctx.facts
        self.log.info(f"Load weight begin. avail mem={facts.avail_after_weights:.2f} GB")
        tic = time.monotonic()
        bar = self._shard_bar(1)
        self.reader.read_for(1.0 * self.pace, LOAD_RATE, int(self.ctx.settings.mem_mb * MB * 0.1))
        if bar is not None:
            bar.update()
            bar.close()
        self.log.info(
            f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type={facts.draft_architecture}, "
            f"avail mem={facts.avail_after_draft:.2f} GB, mem usage={facts.draft_gb:.2f} GB."
        )

    def _allocate_kv(self) -> None:
        facts = self.ctx.facts
        time.sleep(0.25 * self.pace)
        self._group_sync(cpu_group=True)  # the memory profile's minimum over all ranks (gloo)
        self.log.info(
            f"KV Cache is allocated. dtype: {_dtype(self.ctx.args.kv_cache_dtype)}, #tokens: {facts.kv_tokens}, "
            f"K size: {facts.kv_k_gb:.2f} GB, "
            f"V size: {facts.kv_k_gb:.2f} GB"
        )
        if self.scenario is Scenario.DEADLOCK_AFTER_LOAD:
            self._onset()
            hangs.deadlock_forever()
        if self.scenario is Scenario.BUSY_HANG_AFTER_LOAD:
            self._onset()
            hangs.spin_forever()
        if self.scenario is Scenario.LOCK_GIL_AFTER_LOAD:
            self._onset()
            hangs.init_attention_backends()
        if self.scenario is Scenario.GPU_SLEEP_AFTER_LOAD:
            self._onset()
            hangs.gpu_sleep(self.ctx.settings.gpu_file)
        if self.scenario is Scenario.IO_WAIT_AFTER_LOAD:
            self._onset()
            hangs.stuck_in_kernel()
        time.sleep(0.25 * self.pace)
        self.log.info(f"Memory pool end. avail mem={facts.avail_after_kv:.2f} GB")

    def _capture_graphs(self) -> None:
        """SGLang 0.5.16: the target's decode (verify, with speculation) graph, its piecewise prefill
        graph, then the draft's decode and extend graphs (logged by rank 0 only)."""
        facts, args = self.ctx.facts, self.ctx.args
        target_gb = facts.graph_gb - (DRAFT_GRAPH_GB if args.speculative else 0.0)
        avail = facts.avail_after_kv
        name = "target verify" if args.speculative else "target decode"
        per_req = args.num_draft_tokens if args.speculative else 1
        spin = self.scenario is Scenario.BUSY_CAPTURE_HANG
        gb, seconds = target_gb * 0.8, 2.0 * self.pace
        avail = self._capture(name, per_req, avail, gb, seconds, facts.capture_bs, hang=spin and not args.speculative)
        if args.prefill_cuda_graph:
            avail = self._capture_prefill(avail, target_gb * 0.2)
        if args.speculative:
            draft_bs = tuple(bs for bs in facts.capture_bs if bs <= 64) or (1,)
            draft_gb = facts.graph_gb - target_gb
            topk = args.speculative_eagle_topk or 1
            seconds = 0.25 * self.pace  # each draft graph
            avail = self._capture(
                "draft decode", topk, avail, draft_gb / 2, seconds, draft_bs, rank0_only=True, hang=spin
            )
            per_req = args.num_draft_tokens
            self._capture("draft extend", per_req, avail, draft_gb / 2, seconds, draft_bs, rank0_only=True)

    def _capture(
        self,
        name: str,
        per_req: int,
        avail: float,
        mem_gb: float,
        seconds: float,
        sizes: tuple[int, ...],
        rank0_only: bool = False,
        hang: bool = False,
    ) -> float:
        quiet = rank0_only and self.ctx.rank != 0
        if not quiet:
            self.log.info(
                f"Capture {name} CUDA graph begin. backend=full, num_tokens_per_req={per_req}, "
                f"bs={sorted(sizes)}, avail mem={avail:.2f} GB"
            )
        tic = time.monotonic()
        bar = Bar(len(sizes), self._bar_writer) if self.ctx.rank == 0 else None
        for i, bs in enumerate(sizes):
            now_avail = avail - mem_gb * i / len(sizes)
            if bar is not None:
                bar.set_description(f"Capturing batches ({bs=} avail_mem={now_avail:.2f} GB)")
            self._group_sync()  # each captured forward all-reduces across the group
            if hang:
                self._spin_in_capture(sizes[i:])
            time.sleep(seconds / len(sizes))
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        after = avail - mem_gb
        if not quiet:
            self.log.info(
                f"Capture {name} CUDA graph end. elapsed={time.monotonic() - tic:.2f} s, "
                f"mem usage={mem_gb:.2f} GB, avail mem={after:.2f} GB."
            )
        return after

    def _capture_prefill(self, avail: float, mem_gb: float) -> float:
        """The piecewise prefill graph: its bar sits at 0/58 while the first size compiles (no line,
        but CPU, reads and memory move), then the sizes go by quickly."""
        sizes = PREFILL_NUM_TOKENS
        self.log.info(
            f"Capture target prefill CUDA graph begin. backend=breakable, num_tokens={list(sizes)}, "
            f"avail mem={avail:.2f} GB"
        )
        tic = time.monotonic()
        bar = Bar(len(sizes), self._bar_writer) if self.ctx.rank == 0 else None
        compiled: list[bytes] = []
        for i, n in enumerate(reversed(sizes)):
            if bar is not None:
                now_avail = avail - mem_gb * i / len(sizes)
                bar.set_description(f"Capturing num tokens (num_tokens={n} avail_mem={now_avail:.2f} GB)")
            if i > 0:  # the first size compiles first, then captures
                self._group_sync()
            if i == 0 and self.scenario is Scenario.LONG_COMPILE:
                # inductor and triton at one core: no line, no read, no memory change, GPU idle
                compile_fx_inner("prefill_graph", 8, self.ctx.settings.compile_seconds)
            elif i == 0:  # the first compilation, or a load of it from the kernel cache
                cold = self.ctx.settings.prefill_compile_seconds
                compiled = import_sglang(kernelcache.compile_seconds(os.environ, "prefill_graph", cold))
                kernelcache.store(os.environ, "prefill_graph")
            time.sleep(0.5 * self.pace / len(sizes))
            if bar is not None:
                bar.update()
        if bar is not None:
            bar.close()
        del compiled
        after = avail - mem_gb
        self.log.info(
            f"Capture target prefill CUDA graph end. elapsed={time.monotonic() - tic:.2f} s, "
            f"mem usage={mem_gb:.2f} GB, avail mem={after:.2f} GB."
        )
        return after

    def _spin_in_capture(self, sizes: tuple[int, ...]) -> NoReturn:
        """A draft forward under capture launches a kernel that never finishes, then synchronizes:
        one core spins in Event.synchronize, the GPU shows 100 % and almost no SM activity, and
        nothing else moves (REAL_SGLANG.md)."""
        self._onset()
        gpu = self.ctx.settings.gpu_file
        EAGLEDraftCudaGraphRunner(sizes, lambda bs: SpinningKernel(gpu))
        raise AssertionError("a never-ending kernel finished")

    def _crash_oom(self) -> NoReturn:
        self.log.error(crashes.load_oom_traceback(self.ctx.rank, os.getpid()).rstrip("\n"))
        self._onset()
        sys.stdout.flush()
        os._exit(1)
