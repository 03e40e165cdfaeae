"""The one settings model, the rendering of each rung's command, and check-config."""
