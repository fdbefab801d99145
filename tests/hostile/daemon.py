"""Starts a daemon in a session of its own while it builds its model (outside the harness's process group), then
profiles normally: the daemon must not outlive the run."""

import subprocess

import torch


def get_model_and_input():
    subprocess.Popen(["sleep", "777"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return torch.nn.Linear(8, 4).eval(), (torch.randn(2, 8),)
