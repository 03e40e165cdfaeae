"""The Prometheus face: metric families read from the published snapshot at scrape time (collector
style), on a registry the caller gives. docs/METRICS.md lists them. Below the daemon: the owner
counts through `SupervisorMetrics`, which never imports it back."""
