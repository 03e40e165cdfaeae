"""The daemon process's own plumbing on its host: the lock on the state directory (one daemon per
directory), systemd's sd_notify protocol (READY, WATCHDOG, STATUS), and the guard that keeps the API
answering under a descriptor or slow-client flood. About the process, not the server it watches."""
