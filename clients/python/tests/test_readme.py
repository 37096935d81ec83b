"""The README's python examples run as written against a started server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .server import ServerProcess

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str, server: ServerProcess, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETING_")}
    env["TICKETING_ADDR"] = server.addr
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fencing token" in proc.stdout
