"""The one settings model (`[notify]` targets included), and the rendering of each rung's command."""
