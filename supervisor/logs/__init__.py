"""The server's output (keeper, capture, view, journal copy) and the daemon's own logging."""
