"""journald's native datagram protocol, parsed as journald parses it (shared by the journal tests)."""

from __future__ import annotations

import struct


def parse(datagram: bytes) -> dict[str, bytes]:
    """journald's native protocol, as journald reads it: KEY=value lines, or KEY\\n<u64 len><bytes>\\n."""
    fields: dict[str, bytes] = {}
    rest = datagram
    while rest:
        line, _, after = rest.partition(b"\n")
        if b"=" in line:
            key, _, value = line.partition(b"=")
            fields[key.decode()] = value
            rest = after
        else:
            (n,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8 : 8 + n]
            assert after[8 + n : 9 + n] == b"\n"
            rest = after[9 + n :]
    return fields
