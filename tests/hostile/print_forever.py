"""Writes without end while it builds its model."""

import sys


def get_model_and_input():
    line = "x" * 200 + "\n"
    while True:
        sys.stdout.write(line)
