"""Build and run the real Ticketing server for integration tests.

The binary is ``$TICKETING_BIN`` when set, else built once per session with
``go build -o <tmp>/ticketing ./cmd/ticketing`` in the repository root (found from this file).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
TLS_DIR = REPO / "testdata" / "tls"
TOKEN = "correct horse battery staple"

_ADDR = re.compile(r'(?:^|\s)addr="?([^\s"]+)')


def build_server(out_dir: Path) -> Path:
    env_bin = os.environ.get("TICKETING_BIN")
    if env_bin:
        path = Path(env_bin)
        if not path.is_file():
            raise RuntimeError(f"TICKETING_BIN={env_bin} is not a file")
        return path
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("go is not installed; set TICKETING_BIN to a built ticketing binary")
    out = out_dir / "ticketing"
    proc = subprocess.run([go, "build", "-o", str(out), "./cmd/ticketing"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"go build failed:\n{proc.stdout}{proc.stderr}")
    return out


def tls_context() -> ssl.SSLContext:
    """A client context that trusts the test CA."""
    return ssl.create_default_context(cafile=str(TLS_DIR / "ca.pem"))


class ServerProcess:
    """``<bin> server`` on 127.0.0.1 with a free port, stopped with SIGTERM."""

    def __init__(self, binary: Path, data_dir: Path, *, token: str | None = None, tls: bool = False,
                 env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.token = token
        self.tls = tls
        self.extra_env = dict(env or {})
        self.addr = ""
        self.lines: list[str] = []
        self._proc: subprocess.Popen[str] | None = None
        self._pump_thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def start(self, timeout: float = 15.0, addr: str = "127.0.0.1:0") -> ServerProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TICKETING_")}
        env.update(TICKETING_ADDR=addr, TICKETING_DATA_DIR=str(self.data_dir))
        if self.token is not None:
            env["TICKETING_TOKEN"] = self.token
        if self.tls:
            env["TICKETING_TLS_CERT"] = str(TLS_DIR / "server.pem")
            env["TICKETING_TLS_KEY"] = str(TLS_DIR / "server.key")
        env.update(self.extra_env)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.addr = ""
        found = threading.Event()
        self._proc = proc = subprocess.Popen([str(self.binary), "server"], env=env, stdin=subprocess.DEVNULL,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self._pump_thread = threading.Thread(target=self._pump, args=(proc, found), daemon=True)
        self._pump_thread.start()
        if not found.wait(timeout) or not self.addr:
            self.stop()
            raise RuntimeError("server did not log msg=listening (waited up to %.0f s):\n%s" % (timeout, self.log()))
        return self

    def _pump(self, proc: subprocess.Popen[str], found: threading.Event) -> None:
        assert proc.stderr is not None
        with proc.stderr:
            for line in proc.stderr:
                self.lines.append(line.rstrip("\n"))
                if not found.is_set() and "msg=listening" in line:
                    m = _ADDR.search(line)
                    if m:
                        self.addr = m.group(1)
                        found.set()
        found.set()

    def log(self) -> str:
        return "\n".join(self.lines[-50:])

    def stop(self, timeout: float = 10.0) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout)
        self._join_pump()
        return proc.returncode

    def _join_pump(self) -> None:
        if self._pump_thread is not None:
            self._pump_thread.join(5)
            self._pump_thread = None

    def kill(self) -> None:
        """SIGKILL: the connection drops without a goodbye."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self._join_pump()
