"""The library is silent until the application configures logging: its ``ticketing`` logger has
a NullHandler, so Python's last-resort handler never prints the client's warnings (it printed
"the server restarted (new state id): 1 lock(s) lost" to stderr)."""

from __future__ import annotations

import logging
import subprocess
import sys


def test_the_package_logger_has_a_null_handler() -> None:
    import ticketing  # noqa: F401  (the import adds the handler)

    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("ticketing").handlers)


def test_warnings_are_not_printed_without_logging_configured() -> None:
    code = ("import logging, ticketing\n"
            "logging.getLogger('ticketing').warning('the server restarted (new state id): 1 lock(s) lost')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout == ""
    # Configured by the application, the same warning shows.
    code = "import logging\nlogging.basicConfig()\n" + code
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "the server restarted" in proc.stderr
