"""Started with this directory on PYTHONPATH and POWERCUT_LOG and POWERCUT_ROOT
in its environment, a Python process records the file operations of the
durable files' seam under POWERCUT_ROOT into POWERCUT_LOG (tests/server/powercut.py;
tests/server/test_powercut.py starts a server so: its engine worker, a fresh
interpreter with the same environment, records too). Otherwise it does nothing."""

import os

if os.environ.get("POWERCUT_LOG") and os.environ.get("POWERCUT_ROOT"):
    from tests.server import powercut

    powercut.install(os.environ["POWERCUT_LOG"], os.environ["POWERCUT_ROOT"])
