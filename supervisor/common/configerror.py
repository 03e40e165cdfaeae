"""The error a user's configuration causes (config files, the token file, a reload), in one leaf so
the modules that check a piece of it (settings, the API token, alert secrets) raise the same class."""

from __future__ import annotations


class ConfigError(Exception):
    """A config the daemon refuses; the message names each bad key and what was expected."""
