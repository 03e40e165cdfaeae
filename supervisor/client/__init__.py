"""The CLI client: finding the daemon, its verbs, their output, waits and streams."""
