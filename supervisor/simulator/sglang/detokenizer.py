"""`sglang::detokenizer`: turns rank 0's token counts into text and passes everything on to main."""

from __future__ import annotations

import random
from dataclasses import replace
from multiprocessing.connection import Connection

from supervisor.simulator.messages import TokenOut
from supervisor.simulator.modelcard import WORDS
from supervisor.simulator.procutil import become_child, import_sglang, sleep_forever, start_heartbeat


def run_detokenizer_process(ignore_sigterm: bool, inbox: Connection, outbox: Connection, import_s: float) -> None:
    modules = import_sglang(import_s)  # named only once imported, as the schedulers
    become_child("sglang::detokenizer", ignore_sigterm)
    start_heartbeat("detokenizer-heartbeat")
    rng = random.Random(0)
    position = 0
    while True:
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            sleep_forever()  # rank 0 is gone; a ZMQ socket would just never deliver again
        if isinstance(message, TokenOut):
            texts = []
            for n in message.new_tokens:
                words = [WORDS[(position + i) % len(WORDS)] for i in range(n)]
                position += n + rng.randrange(2)
                texts.append("".join(words))
            message = replace(message, texts=tuple(texts))
        try:
            outbox.send(message)
        except OSError:
            del modules
            sleep_forever()
