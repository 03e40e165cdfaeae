"""The server's output (keeper, reader, view, the copy to journald) and the daemon's own logging.

"journal" in this project is the daemon's event file (supervisor.status.journal); the systemd
journal is always called journald (`journald`, the `[logs] journal` key excepted, a config name)."""
