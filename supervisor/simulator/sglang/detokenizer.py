"""`sglang::detokenizer`: turns rank 0's token counts into text and passes everything on to main.

DETOKENIZER_HANG (issue 51): a while after the ready line (rank 0 passes `FiredUp` on to it), the
fast tokenizer's lock is left held by a decode that never returned, and the next output's decode
blocks on it for good: the detokenizer holds every request, the schedulers finish their work and
idle, and no client, health check included, ever gets its output.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection

from supervisor.simulator.messages import FiredUp, TokenOut
from supervisor.simulator.modelcard import WORDS
from supervisor.simulator.onset import write_onset
from supervisor.simulator.options import Scenario
from supervisor.simulator.procutil import become_child, import_sglang, sleep_forever, start_heartbeat
from supervisor.simulator.sglang.startup import RankContext


class Detokenizer:
    def __init__(self, hang: RankContext | None) -> None:
        self.hang = hang  # DETOKENIZER_HANG: rank 0's context (its settings, the main pid)
        self.rng = random.Random(0)
        self.position = 0
        self.hang_at: float | None = None
        # The fast tokenizer's own lock (a Rust mutex in `tokenizers`): one decode at a time.
        self.tokenizer_lock = threading.Lock()

    def on_fired_up(self) -> None:
        if self.hang is not None and self.hang_at is None:
            self.hang_at = time.monotonic() + self.hang.settings.fault_after_s

    def handle_batch_token_id_out(self, message: TokenOut) -> TokenOut:
        if self.hang_at is not None and time.monotonic() >= self.hang_at:
            self.hang_at = None
            self._leave_the_lock_held()
        texts = []
        for n in message.new_tokens:
            texts.append(self.batch_decode(n))
        return replace(message, texts=tuple(texts))

    def batch_decode(self, n: int) -> str:
        with self.tokenizer_lock:
            words = [WORDS[(self.position + i) % len(WORDS)] for i in range(n)]
            self.position += n + self.rng.randrange(2)
            return "".join(words)

    def _leave_the_lock_held(self) -> None:
        """A decode on another thread took the tokenizer's lock and never gave it back."""
        assert self.hang is not None
        s, ctx = self.hang.settings, self.hang
        write_onset(s.onset_file, s.scenario.value, s.requested.value, ctx.main_pid, ctx.args.unknown_flags)
        taker = threading.Thread(target=self.tokenizer_lock.acquire, name="decode-stream", daemon=True)
        taker.start()
        taker.join()


def run_detokenizer_process(
    ignore_sigterm: bool, inbox: Connection, outbox: Connection, import_s: float, ctx: RankContext | None = None
) -> None:
    modules = import_sglang(import_s)  # named only once imported, as the schedulers
    become_child("sglang::detokenizer", ignore_sigterm)
    start_heartbeat("detokenizer-heartbeat")
    hangs = ctx is not None and ctx.settings.scenario is Scenario.DETOKENIZER_HANG
    detokenizer = Detokenizer(ctx if hangs else None)
    while True:
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            sleep_forever()  # rank 0 is gone; a ZMQ socket would just never deliver again
        if isinstance(message, FiredUp):
            detokenizer.on_fired_up()
            continue
        if isinstance(message, TokenOut):
            message = detokenizer.handle_batch_token_id_out(message)
        try:
            outbox.send(message)
        except OSError:
            del modules
            sleep_forever()
