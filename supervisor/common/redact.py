"""Secrets out of everything a bundle holds: environment, argv, log lines, tool output.

Three layers, because any one alone leaks: (1) environment keys that look like credentials get
their value replaced; (2) patterns in free text (URL passwords, `Authorization:` headers,
`--api-key X`, `HF_TOKEN=...`, `"password": "..."`); (3) the literal values of every secret found
in (1), scrubbed wherever they appear, so a token echoed by the server into its log or seen by
gdb in a string argument does not survive either.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

REDACTED = "[redacted]"

# Environment keys: the documented globs *TOKEN*, *KEY*, *SECRET*, *PASSWORD*, *PASSWD*,
# *CREDENTIAL*, *AUTH*, case-insensitive.
_SECRET_KEY = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH", re.IGNORECASE)
# In free text and argv a substring rule would eat `max_total_num_tokens=` and `--tokenizer-path`,
# so there a name is secret when one of its words is.
_SECRET_WORDS = frozenset(
    {
        "token",
        "key",
        "apikey",
        "secret",
        "secrets",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "auth",
        "authorization",
    }
)
_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])")

_URL_CRED = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)([^\s/:@\"']+):([^\s/@\"']+)@")
_AUTH_HEADER = re.compile(r"(?i)\b((?:proxy-)?authorization\s*[:=]\s*)[^\r\n\"']+")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{4,}")
_FLAG = re.compile(r"(--?[A-Za-z0-9][A-Za-z0-9_-]*)(=|\s+)(\"[^\"]*\"|'[^']*'|[^\s\"']+)")
_ASSIGN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_.-]*)(\s*=\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&()=\"']+)")
_JSON_PAIR = re.compile(r"([\"'])([A-Za-z0-9_.-]+)\1(\s*:\s*)([\"'])(.*?)(?<!\\)\4")

# Literal values shorter than this, or these words, would wreck the text if scrubbed everywhere.
_MIN_LITERAL = 6
_NOT_SECRET = frozenset({"true", "false", "none", "null", "enabled", "disabled"})


def secret_key(name: str) -> bool:
    """An environment variable whose value is never written (the documented globs)."""
    return bool(_SECRET_KEY.search(name))


@functools.lru_cache(maxsize=4096)  # tool outputs repeat the same few names many thousand times
def secret_name(name: str) -> bool:
    """A flag or assignment name in text whose value is never written (word match)."""
    return any(w.lower() in _SECRET_WORDS for w in _WORD_SPLIT.split(name.lstrip("-")) if w)


def url_passwords(text: str) -> list[str]:
    return [m.group(3) for m in _URL_CRED.finditer(text)]


def argv_secrets(argv: Sequence[str]) -> list[str]:
    """Values given to secret-named flags (`--api-key X`, `--hf-token=X`) and URL passwords."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        found += url_passwords(arg)
        if not arg.startswith("-"):
            continue
        name, eq, value = arg.partition("=")
        if secret_name(name):
            if eq:
                found.append(value)
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                found.append(argv[i + 1])
    return found


@dataclass(frozen=True)
class Redactor:
    literals: tuple[str, ...] = ()  # secret values to scrub anywhere, longest first

    @classmethod
    def from_envs(cls, envs: Iterable[Mapping[str, str]], extra: Iterable[str] = ()) -> Redactor:
        found: set[str] = set(extra)
        for env in envs:
            for key, value in env.items():
                if secret_key(key):
                    found.add(value)
                found.update(url_passwords(value))
        return cls(literals=_usable(found))

    def with_literals(self, values: Iterable[str]) -> Redactor:
        return Redactor(literals=_usable({*self.literals, *values}))

    def text(self, s: str) -> str:
        for lit in self.literals:
            if lit in s:
                s = s.replace(lit, REDACTED)
        s = _URL_CRED.sub(lambda m: f"{m.group(1)}{m.group(2)}:{REDACTED}@", s)
        s = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{REDACTED}", s)
        s = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", s)
        s = _FLAG.sub(_sub_named(3), s)
        s = _ASSIGN.sub(_sub_named(3), s)
        return _JSON_PAIR.sub(_sub_json, s)

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        return {k: REDACTED if secret_key(k) else self.text(v) for k, v in sorted(env.items())}

    def argv(self, argv: Sequence[str]) -> tuple[str, ...]:
        out: list[str] = []
        hide_next = False
        for arg in argv:
            if hide_next and not arg.startswith("--"):
                out.append(REDACTED)
                hide_next = False
                continue
            hide_next = False
            if arg.startswith("-") and secret_name(arg.split("=", 1)[0]):
                if "=" in arg:
                    out.append(arg.split("=", 1)[0] + "=" + REDACTED)
                else:
                    out.append(arg)
                    hide_next = True
                continue
            out.append(self.text(arg))
        return tuple(out)

    def obj(self, value: object) -> object:
        """A JSON-able structure with secret-named keys' values and every string redacted."""
        if isinstance(value, Mapping):
            return {str(k): REDACTED if secret_key(str(k)) and _scalar(v) else self.obj(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.obj(v) for v in value]
        if isinstance(value, str):
            return self.text(value)
        return value


def _scalar(v: object) -> bool:
    """Only a string can carry a credential: a count under a key like `tokens` is a figure."""
    return isinstance(v, str)


def _usable(values: Iterable[str]) -> tuple[str, ...]:
    keep = {v for v in values if len(v) >= _MIN_LITERAL and v.lower() not in _NOT_SECRET and REDACTED not in v}
    return tuple(sorted(keep, key=lambda v: (-len(v), v)))


def _sub_named(value_group: int) -> Callable[[re.Match[str]], str]:
    def sub(m: re.Match[str]) -> str:
        if not secret_name(m.group(1)) or m.group(value_group) == REDACTED:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}{REDACTED}"

    return sub


def _sub_json(m: re.Match[str]) -> str:
    if not secret_name(m.group(2)):
        return m.group(0)
    q = m.group(4)
    return f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{q}{REDACTED}{q}"
