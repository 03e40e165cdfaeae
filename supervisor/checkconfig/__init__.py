"""`sglang-supervisor check-config`: a verb beside the client. It renders each rung's command line,
asks SGLang's own parser, and runs the checks `run` would refuse on (token file, public API without
a token, ports, GPU strangers, group and watchdog settings), naming the key. It reads the layers
below (config, policy, process, daemon's clean slate) and nothing imports it but the CLI."""
