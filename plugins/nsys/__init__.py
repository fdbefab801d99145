"""Nsight Systems adapter: find nsys, build the capture/export command lines, read the SQLite export."""
