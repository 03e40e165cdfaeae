"""A follow stream's work happens on the API's pool; the loop only sends a few chunks per read."""

from __future__ import annotations

import threading
from pathlib import Path

from api.follow import READ_BUDGET
from api.pool import ApiPool
from api.streams import CHUNK, follow_chunks, joined, start_following


async def test_a_flood_is_rendered_off_the_loop_and_sent_in_chunks_not_lines(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    pool = ApiPool()
    follower = await start_following(log, pool)
    flood = b"".join(b"flood %06d %s\n" % (i, b"f" * 100) for i in range(8000))  # about one read's budget
    with open(log, "ab") as w:
        w.write(flood)
    rendered_on: set[threading.Thread] = set()

    def render(lines: list[bytes]) -> list[bytes]:
        rendered_on.add(threading.current_thread())
        return joined(line.upper() + b"\n" for line in lines)

    stream = follow_chunks(follower, render, 0.01, pool)
    got: list[bytes] = []
    while sum(map(len, got)) < len(flood):
        got.append(await anext(stream))
    await stream.aclose()
    pool.close()
    assert b"".join(got) == flood.upper(), "every line, whole and in order"
    # A line per write held the loop for the whole read (8,000 redactions and writes in one turn).
    assert len(got) <= len(flood) // CHUNK + len(flood) // READ_BUDGET + 2, len(got)
    assert threading.current_thread() not in rendered_on


def test_joined_keeps_pieces_whole_in_chunks_of_about_the_size() -> None:
    pieces = [b"a" * 30, b"b" * 30, b"c" * 30, b"d" * 5]
    assert joined(pieces, size=50) == [b"a" * 30 + b"b" * 30, b"c" * 30 + b"d" * 5]
    assert joined([], size=50) == []
