"""Benchmarks that print tables and write docs/BENCHMARKS.md (not tests). Each runs from the
repository root as `python -m bench.<name>` (bench/README.md); they drive the daemon through its
public faces: the composition root (`supervisor.root.inprocess`, or `python -m supervisor run`),
`supervisor.config`, `supervisor.diagnostics`, `supervisor.process` and the probes."""
