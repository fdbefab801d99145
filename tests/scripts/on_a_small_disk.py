"""Run a command with a small, fresh tmpfs mounted at a folder, then list what it left there:

    python on_a_small_disk.py FOLDER SIZE LISTING -- CMD...

Meant to run inside a private mount namespace (`unshare --mount`, with `--map-root-user` where the caller is not
root): the mount is seen by this process and its children only and goes away with them. A disk that fills up, for
real, with no mock anywhere. LISTING (outside FOLDER) receives the relative paths of the files left under FOLDER,
one per line. Exits with the command's status. Standard library only (mount(2) through ctypes).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

MS_PRIVATE, MS_REC = 1 << 18, 1 << 14


def main() -> int:
    folder, size, listing, _, *command = sys.argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # nothing leaks to the parent namespace
        raise OSError(ctypes.get_errno(), "cannot make mounts private")
    os.makedirs(folder, exist_ok=True)
    if libc.mount(b"tmpfs", folder.encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        raise OSError(ctypes.get_errno(), f"cannot mount a tmpfs at {folder}")
    code = subprocess.run(command, check=False).returncode
    left = sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*") if p.is_file())
    Path(listing).write_text("".join(f"{name}\n" for name in left), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
