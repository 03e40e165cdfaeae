"""A log flood as a server with request logging and a misbehaving tokenizer produces one.

As fast as the pipe takes it: request-log lines, lines that are not valid UTF-8, progress bars
redrawn with carriage returns, and one 1 MB line that takes a while to reach its newline. Blocking
writes, so a reader that stops draining stops the server, as it would stop SGLang.
"""

from __future__ import annotations

from supervisor.simulator.bars import bar_cells
from supervisor.simulator.loglines import LogWriter, timestamp

MB = 1024 * 1024
_HUGE_LINE_BYTES = MB


def _block(seq: int) -> bytes:
    ts = timestamp().encode()
    parts: list[bytes] = []
    for i in range(40):
        rid = f"{seq:06x}{i:04x}"
        parts.append(
            b"[" + ts + b"] Receive: obj=GenerateReqInput(rid='" + rid.encode() + b"', text='Summarize the "
            b"following document in three sentences: the quick brown fox jumps over the lazy dog', "
            b"sampling_params={'max_new_tokens': 256, 'temperature': 0.7}, stream=False)\n"
        )
        if i % 10 == 3:  # a detokenized fragment cut inside a multi-byte character, and raw bytes
            parts.append(b"[" + ts + b"] Finish: obj=GenerateReqInput(rid='" + rid.encode() + b"'), out={'text': '"
                         b"\xe4\xbd\xa0\xe5\xa5 \xff\xfe\xc3\x28 \xed\xa0\x80', 'meta_info': {}}\n")
    bar = bytearray()
    for n in range(0, 101, 5):
        bar += f"\rProcessing requests: {n:3d}%|{bar_cells(n / 100)}| {n}/100 [00:00<00:00, 900.00it/s]".encode()
    parts.append(bytes(bar) + b"\n")
    return b"".join(parts)


def flood(log: LogWriter, megabytes: float) -> None:
    total = int(megabytes * MB)
    written = 0
    seq = 0
    huge_at = total // 10
    huge_done = False
    while written < total:
        chunk = _block(seq)
        seq += 1
        log.raw_bytes(chunk)
        written += len(chunk)
        if not huge_done and written >= huge_at:
            head = b"[" + timestamp().encode() + b"] Receive: obj=GenerateReqInput(text='"
            body = b"lorem ipsum dolor sit amet " * (_HUGE_LINE_BYTES // 27)
            log.raw_bytes(head + body)  # no newline yet: a reader sees a partial line
            log.raw_bytes(b"')\n")
            written += len(head) + len(body) + 3
            huge_done = True
