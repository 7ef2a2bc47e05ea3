"""Processes of a test that meet through files in a folder (the intruder
of tests/test_ppermute_processes.py and the processes it forges connections
to): a file appears whole (written, then renamed), and a wait for one is
bounded."""

import os
import time


def write(folder: str, name: str, text: str) -> None:
    """Makes `folder`/`name` hold `text`, all at once."""
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def wait_for(folder: str, name: str, timeout_s: float = 120) -> str:
    """The text of `folder`/`name`, once it is there (AssertionError after
    `timeout_s` seconds without it)."""
    path = os.path.join(folder, name)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.01)
    with open(path) as f:
        return f.read()
