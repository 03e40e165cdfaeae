"""The daemon: the supervisor that owns the state, its helpers, the loop, and what it publishes."""
