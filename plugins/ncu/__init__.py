"""Nsight Compute adapter: find ncu, build the window-restricted replay command, read reports with ncu_report."""
