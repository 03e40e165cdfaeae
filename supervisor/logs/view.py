"""The server's output as the API shows it (`GET /logs`): its file, and the secrets taken out.

The server may echo what it was given (`--api-key`, a token in a URL, `HF_TOKEN`): the same
redaction as a bundle's log tail applies, built from the environment and argv of every rung.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.common.redact import Redactor, argv_secrets
from supervisor.config.render import render_rung
from supervisor.config.settings import Settings


def server_log_file(settings: Settings) -> Path:
    return settings.state_dir / "logs" / "server.log"


def redactor_for(settings: Settings, env: dict[str, str]) -> Redactor:
    rendered = [render_rung(settings.server, r) for r in settings.ladder]
    secrets = [s for r in rendered for s in argv_secrets(r.argv)]
    return Redactor.from_envs([env, *(r.env for r in rendered)], secrets)


class LogRedaction:
    """`text -> text` with secrets out; rebuilt when a reload changes the settings."""

    def __init__(self, settings: Settings, env: dict[str, str]) -> None:
        self._env = env
        self._settings = settings
        self._redactor = redactor_for(settings, env)

    def update(self, settings: Settings) -> None:
        if settings is not self._settings:
            self._settings = settings
            self._redactor = redactor_for(settings, self._env)

    def __call__(self, text: str) -> str:
        return self._redactor.text(text)
