"""Rank 0's event loop once ready: admit, prefill, decode, log and publish stats, and the serving faults.

Every forward pass is a collective with the other ranks (`Step` out, `Ack` back), so a dead peer
turns into a hang here exactly where NCCL would hang: on the next forward, not before.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections import deque
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from supervisor.simulator import hangs
from supervisor.simulator.collective import LeaderMesh
from supervisor.simulator.links import Done
from supervisor.simulator.loglines import LogWriter
from supervisor.simulator.messages import (
    AbortReq,
    Ack,
    FiredUp,
    GenerateReq,
    InfoOut,
    InfoReq,
    SchedulerStats,
    StatsOut,
    Step,
    TokenOut,
)
from supervisor.simulator.mirror.torch.distributed.distributed_c10d import all_reduce
from supervisor.simulator.nodes import node_layout
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario
from supervisor.simulator.sglang import crashes
from supervisor.simulator.sglang.schedwatchdog import start_watchdog
from supervisor.simulator.sglang.segfault import die_of_segfault
from supervisor.simulator.sglang.startup import RankContext

# The step a peer enters to receive rank 0's verify decision (SGLang #28815 skips rank 0's side).
VERIFY_BROADCAST = "verify_broadcast"
SPEC_STEP_COST = 1.74  # a verify step costs this many plain decode steps
ACCEPT_LEN_OK = 3.12
ACCEPT_LEN_LOW = 1.15


@dataclass
class Req:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    is_health: bool
    generated: int = 0

    @property
    def finished(self) -> bool:
        return self.is_health or self.generated >= self.max_new_tokens


class ServingLoop:
    def __init__(
        self,
        ctx: RankContext,
        log: LogWriter,
        inbox: Connection,
        outbox: Connection,
        peers: list[Connection],
        mesh: LeaderMesh | None = None,
    ) -> None:
        self.ctx = ctx
        self.mesh = mesh  # multi-node: the group's links (then `peers` is empty)
        self.log = log
        self.inbox = inbox
        self.outbox = outbox
        self.peers = peers
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.fault_at: float | None = None
        self.stalled = False
        self.rng = random.Random(ctx.args.port)
        args = ctx.args
        self.spec = args.speculative
        low = ctx.settings.scenario is Scenario.LOW_ACCEPT
        self.accept_mean = ACCEPT_LEN_LOW if low else min(ACCEPT_LEN_OK, 0.78 * args.num_draft_tokens)
        self.step_s = ctx.settings.decode_step_s * (SPEC_STEP_COST if self.spec else 1.0)
        self.forward_ct_decode = 0
        self.num_generated = 0
        self.last_decode_tic = time.monotonic()
        self.last_gen_throughput = 0.0
        self.spec_accepted = self.spec_forward = 0
        self.spec_total_accepted = self.spec_total_forward = 0
        self.last_publish = time.monotonic()
        self.last_cuda_graph = 0.0
        spec = bool(ctx.args.speculative)
        self.stats = SchedulerStats(
            spec_num_steps=float(ctx.args.num_steps) if spec else 0.0,
            spec_num_draft_tokens=float(ctx.args.num_draft_tokens) if spec else 0.0,
        )
        self.forward_since: float | None = None  # when the forward pass in progress began
        # Issue 51's wedges, which /health does not see (docs/SIMULATOR.md, "Wedges /health does not see"):
        # `wedged`: the loop turns but admits no request (SGLang #40809); `skip_at_verify`: the next verify
        # step skips its broadcast on this rank (SGLang #28815), after which `wedged` too.
        self.wedged = False
        self.skip_at_verify = False

    def run(self) -> NoReturn:
        start_watchdog(self.ctx.args.watchdog_timeout, lambda: self.forward_since, self.log, self.ctx.main_pid)
        while True:
            self._receive(self._wait_s())
            if self.fault_at is not None and time.monotonic() >= self.fault_at:
                self.fault_at = None
                self._begin_fault()
            if self.wedged:
                self._wedged_turn()
                continue
            if self.waiting:
                self._prefill()
            if self.running:
                self._decode()
            else:
                self._idle_metrics()

    def _wait_s(self) -> float:
        if self.wedged:  # the loop still turns (it receives, answers health checks) and admits nothing
            return self.ctx.settings.decode_step_s
        if (self.waiting and self._has_room()) or (self.running and not self.stalled):
            return 0.0
        if self.running:  # stalled: the forward "runs" but never finishes a step
            return self.step_s
        now = time.monotonic()
        deadline = self.last_publish + self.ctx.settings.idle_metrics_s
        if self.fault_at is not None:
            deadline = min(deadline, self.fault_at)
        return max(0.0, min(1.0, deadline - now))

    def _receive(self, timeout: float) -> None:
        try:
            if not self.inbox.poll(timeout):
                return
            while True:
                self._handle(self.inbox.recv())
                if not self.inbox.poll(0):
                    return
        except (EOFError, OSError):
            os._exit(0)  # the main process is gone; PDEATHSIG would end us anyway

    def _handle(self, message: object) -> None:
        if isinstance(message, GenerateReq):
            self.waiting.append(Req(message.rid, message.prompt_tokens, message.max_new_tokens, message.is_health))
        elif isinstance(message, AbortReq):
            self.waiting = deque(r for r in self.waiting if r.rid != message.rid)
            self.running = [r for r in self.running if r.rid != message.rid]
        elif isinstance(message, InfoReq):
            self._send(InfoOut(message.rid, self._internal_state()))
        elif isinstance(message, FiredUp):
            for peer in self.peers:
                with contextlib.suppress(OSError):
                    peer.send(message)
            if self.mesh is not None:
                self.mesh.fired_up()
            scenario = self.ctx.settings.scenario
            if scenario is Scenario.DETOKENIZER_HANG:
                self._send(message)  # the detokenizer's fault counts from the ready line too
            dies_here = scenario is Scenario.RANK_DIES and node_layout(self.ctx.args).victim() == 0
            if dies_here or scenario in (Scenario.CRASH_AFTER_READY, Scenario.HEALTH_HANGS, Scenario.SERVING_STALL):
                self.fault_at = time.monotonic() + self.ctx.settings.fault_after_s
            if scenario is Scenario.QUEUE_WEDGE or (scenario is Scenario.VERIFY_SKIPS_BROADCAST and self._verifies()):
                self.fault_at = time.monotonic() + self.ctx.settings.fault_after_s

    def _send(self, message: object) -> None:
        with contextlib.suppress(OSError):  # the detokenizer is gone: output is lost, as with ZMQ
            self.outbox.send(message)

    def _begin_fault(self) -> None:
        s = self.ctx.settings
        write_onset(s.onset_file, s.scenario.value, s.requested.value, self.ctx.main_pid, self.ctx.args.unknown_flags)
        if s.scenario is Scenario.CRASH_AFTER_READY:
            self.log.error(crashes.forward_crash_traceback().rstrip("\n"))
            with contextlib.suppress(OSError):
                os.kill(self.ctx.main_pid, signal.SIGQUIT)  # as SGLang's scheduler tells its parent
            os._exit(0)
        elif s.scenario is Scenario.HEALTH_HANGS:
            self.forward_since = time.monotonic()  # a forward pass that never returns
            hangs.wait_for_collective()
        elif s.scenario is Scenario.SERVING_STALL:
            self.stalled = True
            self.forward_since = time.monotonic()  # the decode forward that never completes
        elif s.scenario is Scenario.RANK_DIES:
            die_of_segfault(self.ctx, self.log)
        elif s.scenario is Scenario.QUEUE_WEDGE:
            self.wedged = True  # nothing is printed: SGLang said nothing either
        elif s.scenario is Scenario.VERIFY_SKIPS_BROADCAST:
            self.skip_at_verify = True  # at the next verify step of a running batch

    def _verifies(self) -> bool:
        """#28815 needs speculative decoding (a verify step) and a peer to broadcast to (tp >= 2)."""
        return bool(self.spec) and bool(self.peers)

    def _wedged_turn(self) -> None:
        """One turn of a wedged scheduler's loop (issue 51). SGLang parks a health check that arrives
        while requests run or wait and answers it from the loop (`maybe_send_health_check_signal`,
        scheduler.py 0.5.16 lines 1668-1673, 3593-3600), not from a generation: the loop turns, so the
        health check is answered and /health stays 200. Real requests stay queued; the running batch
        (#40809: it drains; #28815: it is frozen in its verify step) is not touched here."""
        health = [r for r in self.waiting if r.is_health]
        if health:
            self.waiting = deque(r for r in self.waiting if not r.is_health)
            self._send(TokenOut(tuple(r.rid for r in health), (0,) * len(health), (True,) * len(health), "decode"))
        if self.running and self.ctx.settings.scenario is Scenario.QUEUE_WEDGE:
            self.wedged = False  # #40809 admits nothing new, but the batch it runs finishes
            try:
                self._decode()
            finally:
                self.wedged = True
            return
        if time.monotonic() - self.last_publish >= self.ctx.settings.idle_metrics_s:
            used, usage = self._token_usage()
            running = len(self.running)
            self._publish(num_running_reqs=running, num_used_tokens=used, token_usage=usage, gen_throughput=0.0)

    def _forward(self, kind: str) -> None:
        """All ranks take part; a peer that is gone leaves this rank waiting forever, as NCCL does."""
        if not self.stalled:
            self.forward_since = time.monotonic()
        if self.mesh is not None:
            self.mesh.forward(kind)  # every rank of every node; never returns without all of them
        try:
            for peer in self.peers:
                peer.send(Step(kind))
            if self.ctx.settings.scenario is Scenario.COLLECTIVE_SKIPPED:
                # the forward's all-reduce: every rank's share in, then the result out to every rank;
                # a rank that skipped it leaves this one, and every rank that joined, waiting in it
                all_reduce(self.peers, lambda m: isinstance(m, Ack))
                for peer in self.peers:
                    peer.send(Done())
            else:
                for peer in self.peers:
                    reply = peer.recv()
                    if not isinstance(reply, Ack):
                        hangs.wait_for_collective()
        except (EOFError, OSError):
            hangs.wait_for_collective()
        if not self.stalled:  # a stalled decode forward stays "in progress" for SGLang's watchdog
            self.forward_since = None

    def _token_usage(self) -> tuple[int, float]:
        used = sum(r.prompt_tokens + r.generated for r in self.running)
        return used, used / max(1, self.ctx.facts.kv_tokens)

    def _has_room(self) -> bool:
        cap = self.ctx.args.max_running_requests
        return cap is None or len(self.running) < cap or any(r.is_health for r in self.waiting)

    def _admit(self) -> list[Req]:
        """What the prefill takes from the queue: everything, or with `--max-running-requests` given, no
        more real requests than the running batch has room for (SGLang's PrefillAdder); the rest wait
        (`#queue-req`, `num_queue_reqs`). Health checks are one token and always go."""
        cap = self.ctx.args.max_running_requests
        if cap is None:
            batch = list(self.waiting)
            self.waiting.clear()
            return batch
        room = max(0, cap - len(self.running))
        batch, kept = [], deque[Req]()
        for req in self.waiting:
            if req.is_health or room > 0:
                batch.append(req)
                room -= 0 if req.is_health else 1
            else:
                kept.append(req)
        self.waiting = kept
        return batch

    def _prefill(self) -> None:
        batch = self._admit()
        if not batch:
            return
        real = [r for r in batch if not r.is_health]
        running_bs = len(self.running)
        if real:
            _, usage = self._token_usage()
            new_tokens_in = sum(r.prompt_tokens for r in real)
            self.log.info(  # SGLang 0.5.16 metrics_reporter.py
                f"Prefill batch, #new-seq: {len(real)}, #new-token: {new_tokens_in}, "
                f"#cached-token: 0, token usage: {usage:.2f}, #running-req: {running_bs}, "
                f"#queue-req: {len(self.waiting)}, "
                f"#pending-token: 0, cuda graph: False, "
                f"input throughput (token/s): {new_tokens_in / max(self.ctx.settings.decode_step_s, 1e-3):.2f}"
            )
        self._forward("prefill")
        time.sleep(self.ctx.settings.decode_step_s)
        new_tokens = []
        for req in batch:
            n = 1 if req.max_new_tokens > 0 else 0
            req.generated += n
            new_tokens.append(n)
        rids, finished = tuple(r.rid for r in batch), tuple(r.finished for r in batch)
        self._send(TokenOut(rids, tuple(new_tokens), finished, "prefill"))
        self.running.extend(r for r in batch if not r.finished)
        if real:
            # SGLang 0.5.16 (metrics_reporter.py) publishes a prefill's stats with the running batch as it
            # was before this batch joined it, the "#running-req" of the log line: a stall right after a
            # prefill of new requests leaves `num_running_reqs` at 0 (seen on real SGLang at tp 2).
            used, usage = self._token_usage()
            self._publish(num_running_reqs=running_bs, num_used_tokens=used, token_usage=usage)

    def _decode(self) -> None:
        if self.stalled:
            return  # the forward never completes: no tokens, no log, no stats (_wait_s paces the loop)
        if self.skip_at_verify:
            self._skip_verify_broadcast()
            return
        tic = time.monotonic()
        self._forward("decode")
        counts = []
        for req in self.running:
            n = self._accepted() if self.spec else 1
            if self.spec:
                self.spec_accepted += n
                self.spec_forward += 1
            n = min(n, req.max_new_tokens - req.generated)
            req.generated += n
            self.num_generated += n
            counts.append(n)
        time.sleep(max(0.0, self.step_s - (time.monotonic() - tic)))
        batch = self.running
        self._send(TokenOut(tuple(r.rid for r in batch), tuple(counts), tuple(r.finished for r in batch), "decode"))
        self.forward_ct_decode += 1
        cuda_graph = self.ctx.args.cuda_graph and len(batch) <= max(self.ctx.facts.capture_bs)
        self.last_cuda_graph = 1.0 if cuda_graph else 0.0
        if self.forward_ct_decode % self.ctx.args.decode_log_interval == 0:
            self._log_decode(len(batch), cuda_graph)
        self.running = [r for r in batch if not r.finished]

    def _skip_verify_broadcast(self) -> None:
        """SGLang #28815: the verify step's greedy branch on this rank takes no part in the broadcast of
        its decision (`predict`, `accept_index`, `num_correct_drafts`); the peers enter that broadcast
        and wait in it for good (a kernel that never ends), and this rank goes on, idle, with its running
        batch never finishing. No log line, no error: the scheduler's watchdog covers only this rank's own
        forward, which returned."""
        self.forward_since = time.monotonic()
        for peer in self.peers:
            with contextlib.suppress(OSError):
                peer.send(Step(VERIFY_BROADCAST))
        self.forward_since = None
        self.skip_at_verify = False
        self.wedged = True

    def _accepted(self) -> int:
        whole = int(self.accept_mean)
        return whole + (1 if self.rng.random() < self.accept_mean - whole else 0)

    def _log_decode(self, bs: int, cuda_graph: bool) -> None:
        now = time.monotonic()
        self.last_gen_throughput = self.num_generated / max(1e-6, now - self.last_decode_tic)
        self.last_decode_tic = now
        self.num_generated = 0
        used, usage = self._token_usage()
        msg = f"Decode batch, #running-req: {bs}, #token: {used}, token usage: {usage:.2f}, "
        accept_len = accept_rate = 0.0
        if self.spec and self.spec_forward:
            accept_len = self.spec_accepted / self.spec_forward
            # 0.5.16: drafts accepted (the bonus token aside) over drafts proposed
            drafts = self.spec_forward * max(1, self.ctx.args.num_draft_tokens - 1)
            accept_rate = (self.spec_accepted - self.spec_forward) / drafts
            self.spec_total_accepted += self.spec_accepted
            self.spec_total_forward += self.spec_forward
            self.stats = replace(self.stats, spec_verify_calls=float(self.spec_total_forward))
            self.spec_accepted = self.spec_forward = 0
            msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
        msg += (
            f"cuda graph: {cuda_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {len(self.waiting)}"
        )
        self.log.info(msg)
        spec_fields = {"spec_accept_length": accept_len, "spec_accept_rate": accept_rate} if self.spec else {}
        self._publish(
            num_running_reqs=bs,
            num_used_tokens=used,
            token_usage=usage,
            gen_throughput=self.last_gen_throughput,
            **spec_fields,
        )

    def _idle_metrics(self) -> None:
        # SGLang republishes its gauges every 30 s while idle, with the throughput at 0.
        if time.monotonic() - self.last_publish >= self.ctx.settings.idle_metrics_s:
            self._publish(num_running_reqs=0, num_used_tokens=0, token_usage=0.0, gen_throughput=0.0)

    def _publish(self, **fields: Any) -> None:
        """Update the stats SGLang keeps between logs (unnamed fields keep their last value) and push them."""
        self.last_publish = time.monotonic()
        self.stats = replace(
            self.stats,
            **fields,
            num_queue_reqs=len(self.waiting),
            is_cuda_graph=self.last_cuda_graph,
            max_total_num_tokens=self.ctx.facts.kv_tokens,
        )
        if self.ctx.args.enable_metrics:
            self._send(StatsOut(self.stats))

    def _internal_state(self) -> dict[str, object]:
        facts = self.ctx.facts
        state: dict[str, object] = {
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {
                "weight": facts.weight_gb,
                "kvcache": round(2 * facts.kv_k_gb, 2),
                "token_capacity": facts.kv_tokens,
                "graph": facts.graph_gb,
            },
        }
        # SGLang 0.5.16 adds a decode-log interval's verify steps to its totals only when it logs
        # the `Decode batch` line: before the first one (a short warm-up) there is no figure.
        if self.spec_total_forward:
            state["avg_spec_accept_length"] = self.spec_total_accepted / self.spec_total_forward
        return state
