"""The status contract: what the daemon publishes and what its readers (api/, group/, alerting/,
client/) may rely on. The `/status` snapshot, the command queue's records, the event journal file,
the names of causes, hang classes and journal events, and the launch timeline.

It imports nothing else of the daemon (only `probes.types` and `supervisor.common`), so every
reader imports it downward and a change here is a change of the contract (DESIGN.md)."""
