"""The API's bearer token: where it comes from (`[api] token_file`, else the environment variable
`token_env`), and where the daemon may listen without one. The daemon, check-config and the client
read it the same way; the file holding it must be private to its owner, like an ssh key.
"""

from __future__ import annotations

import ipaddress
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from supervisor.common.configerror import ConfigError


class TokenSettings(Protocol):
    """The two `[api]` keys that say where the token is (config.settings.ApiSettings has them)."""

    @property
    def token_file(self) -> str | None: ...

    @property
    def token_env(self) -> str: ...


def load_token(settings: TokenSettings, env: Mapping[str, str], *, client: bool = False) -> str | None:
    """The token from `[api] token_file`, else from the environment variable `token_env`, else None.
    `client`: read for the CLI, not the daemon (see read_token_file)."""
    if settings.token_file:
        return read_token_file(Path(settings.token_file), client=client)
    value = env.get(settings.token_env, "").strip()
    return value or None


def read_token_file(path: Path, where: str | None = None, *, client: bool = False) -> str:
    """The token in `path`, which must be a regular file private to this process's user (owned by
    it, no group or other bits): a 0600 file of another user is someone else's to rewrite.

    One exception, for the client (`client=True`) run as root: the daemon's token owned by the
    service user (systemd/README.md, "Running as a dedicated user"). The daemon checks a token it
    accepts; the client only presents one, and root reads every file anyway."""
    where = where or f"[api] token_file {str(path)!r}"
    try:
        st = path.stat()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where}: not a regular file")
    if st.st_uid != os.geteuid() and not (client and os.geteuid() == 0):
        raise ConfigError(
            f"{where}: owned by uid {st.st_uid}, not by this process's user (uid {os.geteuid()}); "
            f"`chown {os.geteuid()} {path}` if it is yours"
        )
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{where}: readable or writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"make it private with `chmod 600 {path}`"
        )
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{where}: cannot read it: {err.strerror or err}") from None
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    if not token:
        raise ConfigError(f"{where}: the file is empty; put a long random token in it")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"{where}: the token must be one line of printable characters without spaces")
    return token


MIN_TOKEN_BYTES = 16  # 128 bits of a random hex or base64 token; a page login is throttled, not free


def too_short(token: str) -> str | None:
    """Why `token` is too short to stand for the daemon (None: long enough); never quotes it."""
    n = len(token.encode("utf-8"))
    if n >= MIN_TOKEN_BYTES:
        return None
    return (
        f"the token is {n} bytes, shorter than {MIN_TOKEN_BYTES}: anyone who reaches the API could guess it; "
        "put a long random one in it (`openssl rand -hex 32`)"
    )


def is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse to listen beyond this machine without a token."""
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"[api] host {host!r} is not a loopback address and no API token is configured: "
            "set [api] token_file (mode 0600) or the token environment variable, or bind 127.0.0.1"
        )
