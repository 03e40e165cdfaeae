"""Real SGLang under the daemon on a GPU machine, from a bundle (bench/real/README.md):
`python3 -m bench.real.run ...` there, `python3 -m bench.real.report` here. `inject/` is not part of
this package: it goes on the server's PYTHONPATH (sitecustomize) and patches SGLang on import."""
