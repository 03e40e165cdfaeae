"""Warm start: back to serving fast after an incident (issue 36), one package.

`warm.WarmStart` is the one object the owner holds: it listens to the launch's events (launched,
adopted, lines, ready, incident, evidence, stopped, GPU fault) and answers two queries, the launch
environment (`launching`: the kernel caches, pinned per fingerprint) and the stall window in force
(`window`: learned from good launches). `timeline` keeps the book of good launches and the outage
clock, `kernelcache` the caches under `[paths] cache_dir`, `residency` the weights' page-cache
residency. The learned windows themselves are pure decisions (supervisor.policy.learned).
"""
