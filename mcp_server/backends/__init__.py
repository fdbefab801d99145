"""The profiler backends: one adapter each (what it needs, its main pass, preflight's checks of its tools, its
assembler) and the registry that lists them, above the capture and assemble stages whose functions they name."""
