"""Notifications without Prometheus: `[[notify]]` webhooks (generic JSON, Slack, PagerDuty Events v2)
and exec hooks, told of incidents, `failed`, recoveries and servers that stayed stopped.

Not to be confused with `supervisor.daemon.sdnotify`, which speaks systemd's sd_notify protocol.
`events` decides what is worth telling (pure), `shapes` renders each receiver's body (pure),
`deliver` makes one attempt, `dispatch` queues, retries, journals and counts.
"""
