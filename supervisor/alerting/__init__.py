"""Notifications without Prometheus: `[[notify]]` webhooks (generic JSON, Slack, PagerDuty Events v2)
and exec hooks, told of incidents, `failed`, recoveries, servers that stayed stopped and launches
blocked past the backoff cap.

Not to be confused with `supervisor.host.sdnotify`, which speaks systemd's sd_notify protocol.
`events` decides what is worth telling (pure), `shapes` renders each receiver's body (pure),
`deliver` makes one attempt, `dispatch` queues, retries, journals and counts.
"""
