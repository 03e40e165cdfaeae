"""A log flood as a server with request logging and a misbehaving tokenizer produces one.

As fast as the pipe takes it: request-log lines, lines that are not valid UTF-8, progress bars
redrawn with carriage returns, and one 1 MB line that takes a while to reach its newline. Blocking
writes, so a reader that stops draining stops the server, as it would stop SGLang.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from supervisor.simulator.bars import bar_cells
from supervisor.simulator.loglines import timestamp

MB = 1024 * 1024
_HUGE_LINE_BYTES = MB
_MANGLED = b"\xe4\xbd\xa0\xe5\xa5 \xff\xfe\xc3\x28 \xed\xa0\x80"  # cut inside a multi-byte character, raw bytes


class RawSink(Protocol):
    def raw_bytes(self, data: bytes) -> None: ...


def _sglang_lines(seq: int, i: int) -> list[bytes]:
    ts, rid = timestamp().encode(), f"{seq:06x}{i:04x}".encode()
    lines = [
        b"[" + ts + b"] Receive: obj=GenerateReqInput(rid='" + rid + b"', text='Summarize the "
        b"following document in three sentences: the quick brown fox jumps over the lazy dog', "
        b"sampling_params={'max_new_tokens': 256, 'temperature': 0.7}, stream=False)\n"
    ]
    if i % 10 == 3:  # a detokenized fragment, not valid UTF-8
        lines.append(b"[" + ts + b"] Finish: obj=GenerateReqInput(rid='" + rid + b"'), out={'text': '"
                     + _MANGLED + b"', 'meta_info': {}}\n")
    return lines


def _vllm_lines(seq: int, i: int) -> list[bytes]:
    """vLLM with --enable-log-requests: entrypoints/serve/utils/request_logger.py:63's record per request."""
    head = f"INFO {time.strftime('%m-%d %H:%M:%S')} [request_logger.py:63] ".encode()
    rid = f"cmpl-{seq:06x}{i:04x}-0".encode()
    lines = [
        head + b"Received request " + rid + b": params: SamplingParams(n=1, presence_penalty=0.0, "
        b"frequency_penalty=0.0, repetition_penalty=1.0, temperature=0.7, top_p=1.0, top_k=0, min_p=0.0, "
        b"seed=None, stop=[], stop_token_ids=[], bad_words=[], include_stop_str_in_output=False, "
        b"ignore_eos=False, max_tokens=256, min_tokens=0, logprobs=None, prompt_logprobs=None, "
        b"skip_special_tokens=True, spaces_between_special_tokens=True, truncate_prompt_tokens=None, "
        b"structured_outputs=None, extra_args=None), lora_request: None.\n"
    ]
    if i % 10 == 3:
        lines.append(head + b"Received request " + rid + b"-1: params: " + _MANGLED + b", lora_request: None.\n")
    return lines


STYLES: dict[str, Callable[[int, int], list[bytes]]] = {"sglang": _sglang_lines, "vllm": _vllm_lines}


def _block(seq: int, lines: Callable[[int, int], list[bytes]] = _sglang_lines) -> bytes:
    parts: list[bytes] = []
    for i in range(40):
        parts += lines(seq, i)
    bar = bytearray()
    for n in range(0, 101, 5):
        bar += f"\rProcessing requests: {n:3d}%|{bar_cells(n / 100)}| {n}/100 [00:00<00:00, 900.00it/s]".encode()
    parts.append(bytes(bar) + b"\n")
    return b"".join(parts)


def flood(log: RawSink, megabytes: float, style: str = "sglang") -> None:
    total = int(megabytes * MB)
    written = 0
    seq = 0
    huge_at = total // 10
    huge_done = False
    while written < total:
        chunk = _block(seq, STYLES[style])
        seq += 1
        log.raw_bytes(chunk)
        written += len(chunk)
        if not huge_done and written >= huge_at:
            head = _block_head(style)
            body = b"lorem ipsum dolor sit amet " * (_HUGE_LINE_BYTES // 27)
            log.raw_bytes(head + body)  # no newline yet: a reader sees a partial line
            log.raw_bytes(b"')\n" if style == "sglang" else b"']), lora_request: None.\n")
            written += len(head) + len(body) + 3
            huge_done = True


def _block_head(style: str) -> bytes:
    if style == "sglang":
        return b"[" + timestamp().encode() + b"] Receive: obj=GenerateReqInput(text='"
    when = time.strftime("%m-%d %H:%M:%S")
    return f"INFO {when} [request_logger.py:63] Received request cmpl-huge: params: SamplingParams(stop=['".encode()
