"""Starts a worker in its process group and a daemon in a session of its own, then never returns from building
its model: everything it started must die with the run, however the run is stopped."""

import subprocess
import time


def get_model_and_input():
    subprocess.Popen(["sleep", "778"])
    subprocess.Popen(["sleep", "779"], start_new_session=True)
    while True:
        time.sleep(1)
