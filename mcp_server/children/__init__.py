"""The scripts that run under the workload's own interpreter: the capture harness, bench, validate and the peak
microbenchmark, with their common part. They need only the standard library and torch, and never import the
engine; the engine runs them as files (`mcp_server.process.child_scripts`) and shares only `contract` with them."""
