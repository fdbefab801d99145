"""Stands in for ncu's launch/attach handshake on machines without Nsight Compute (tests only).

`--mode launch ... --port P <command...>`: wait for one connection on 127.0.0.1:P, then run the command and
exit with its code. `--mode attach ... --port P --export R`: connect, wait until the launched command has ended,
write R.ncu-rep (empty) and exit 0; with NCU_STANDIN_REFUSE=1 in the environment it fails to attach instead.
Nothing is profiled: the real tool is exercised on the GPU machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def _launch(args: list[str]) -> int:
    command = args[args.index("--port") + 2:]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", int(_value(args, "--port"))))
        server.listen(1)
        port = _value(args, "--port")
        print(f"==PROF== Waiting for profiler to attach on ports {port} (pid={os.getpid()})", flush=True)
        connection, _ = server.accept()
        with connection:
            return subprocess.call(command)


def _attach(args: list[str]) -> int:
    if os.environ.get("NCU_STANDIN_REFUSE") == "1":
        print("==ERROR== No attachable process found", flush=True)
        return 1
    with socket.create_connection(("127.0.0.1", int(_value(args, "--port"))), timeout=10) as connection:
        connection.settimeout(None)
        connection.recv(1)  # returns once the launched command has ended and the launcher closed the socket
    with open(_value(args, "--export") + ".ncu-rep", "wb"):
        pass
    print("==PROF== Disconnected from process", flush=True)
    return 0


if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(_launch(argv) if _value(argv, "--mode") == "launch" else _attach(argv))
