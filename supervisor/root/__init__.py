"""The composition root: `serve` builds the daemon (probes, the owner, metrics, alerting, the API)
from one Settings and runs it; `inprocess` does the same inside a caller's loop (the demo, bench).
It is the one importer of `api/` and sits above supervisor.daemon, which never imports it."""
