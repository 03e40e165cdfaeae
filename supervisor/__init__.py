# The one place the version is written: pyproject.toml reads it (dynamic), `sglang-supervisor --version`,
# /status and the metrics print it. A release bumps it here and adds its CHANGELOG.md section (docs/RELEASE.md).
__version__ = "0.2.0"
