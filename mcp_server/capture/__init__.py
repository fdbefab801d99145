"""Capture: the workload's measured window, run under torch.profiler, nsys and ncu, into a run directory.

`schedule.capture` chooses the passes and their turns on the GPU, `passes` runs each one (the harness as a child
process under the workload's interpreter, optionally under a profiler), `variants` replays the launches ncu's key
cannot tell apart, and `replay_plan` says which those are. What they leave is the run directory's raw artifacts
and its manifest.
"""
