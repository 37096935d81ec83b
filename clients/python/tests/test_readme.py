"""The README's python examples run as written, each against a started server of the kind it
needs (plain, or TLS with a token, or mutual TLS), with the address and credentials in the
environment the examples read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .server import TOKEN, ServerProcess, TLSFiles

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def test_readme_has_examples() -> None:
    assert len(BLOCKS) >= 6


def _run(code: str, env_extra: dict[str, str], tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETING_")}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_example_runs(code: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    if "TICKETING_CA_FILE" in code:
        tls: TLSFiles = request.getfixturevalue("tls_files")
        srv: ServerProcess = request.getfixturevalue("tls_server")
        out = _run(code, {"TICKETING_ADDR": srv.addr, "TICKETING_TOKEN": TOKEN,
                          "TICKETING_CA_FILE": str(tls.ca)}, tmp_path)
        mtls: ServerProcess = request.getfixturevalue("mtls_server")
        out += _run(code, {"TICKETING_ADDR": mtls.addr, "TICKETING_CA_FILE": str(tls.ca),
                           "TICKETING_CLIENT_CERT": str(tls.client_cert),
                           "TICKETING_CLIENT_KEY": str(tls.client_key)}, tmp_path)
        assert out.count("fencing token") == 2
    else:
        srv = request.getfixturevalue("server")
        out = _run(code, {"TICKETING_ADDR": srv.addr}, tmp_path)
        assert "fencing token" in out
    assert "lost" not in out
