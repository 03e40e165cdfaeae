"""A group's credentials from `[group] secret_file` / `key_file`: refused at start when absent.

The files are private (mode 0600 or 0400, owned by the daemon's user or root), one line of printable text. The
secret's bytes are used as they are; a key file holds a node key as 64 hex digits (what
`sglang-supervisor group-key` prints).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from supervisor.common.configerror import ConfigError
from supervisor.config.settings import GroupSettings
from supervisor.group.signing import node_key

NO_CREDENTIALS = (
    "[group] has no credentials: the daemons of a group prove who they are to each other. Set "
    "secret_file to a private file (chmod 600) holding one long random line, the same on every node "
    "(e.g. `openssl rand -hex 32`); a worker may instead set key_file to its own key "
    "(`sglang-supervisor group-key --config <leader's config> --node N`)"
)
MIN_SECRET_CHARS = 16


@dataclass(frozen=True)
class GroupKeys:
    """What this node can sign with: every node's key (the secret's holder) or only its own."""

    node: int
    secret: bytes | None
    own: bytes

    def key(self, node: int) -> bytes:
        if node == self.node:
            return self.own
        if self.secret is None:
            raise LookupError(f"node {self.node} holds only its own key, not node {node}'s")
        return node_key(self.secret, node)

    def __repr__(self) -> str:  # never a key in a log line or a traceback
        return f"GroupKeys(node={self.node}, secret={'set' if self.secret else 'none'})"


def read_private_line(path: Path, where: str) -> str:
    try:
        st = path.stat()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{where}: readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"make it private with `chmod 600 {path}`"
        )
    if st.st_uid not in (os.geteuid(), 0):  # root's files are trusted (a Kubernetes Secret volume's are root's)
        raise ConfigError(f"{where}: owned by uid {st.st_uid}, not this daemon's user (uid {os.geteuid()}) or root")
    try:
        text = path.read_bytes().decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{where}: cannot read it as UTF-8 text: {err}") from None
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        raise ConfigError(f"{where}: must be one line of printable characters without spaces")
    return text


def load_keys(g: GroupSettings) -> GroupKeys:
    """This node's keys; ConfigError (named, clear) when the group has none or they are unusable."""
    if g.secret_file:
        secret = read_private_line(Path(g.secret_file), f"[group] secret_file {g.secret_file!r}")
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(
                f"[group] secret_file: the secret is {len(secret)} characters; use at least {MIN_SECRET_CHARS}"
            )
        raw = secret.encode("utf-8")
        return GroupKeys(g.node_rank, raw, node_key(raw, g.node_rank))
    if g.key_file and not g.is_leader:
        text = read_private_line(Path(g.key_file), f"[group] key_file {g.key_file!r}")
        try:
            own = bytes.fromhex(text)
        except ValueError:
            own = b""
        if len(own) != 32:
            raise ConfigError("[group] key_file: not a node key (64 hex digits from `sglang-supervisor group-key`)")
        return GroupKeys(g.node_rank, None, own)
    raise ConfigError(NO_CREDENTIALS)
