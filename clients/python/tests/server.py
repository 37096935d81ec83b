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


class TLSFiles:
    """Throwaway TLS material made with the openssl CLI at test time (no key is committed): a
    CA, a server certificate for localhost / 127.0.0.1 / ::1, and a client certificate."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = directory / "ca.pem"
        self.server_cert = directory / "server.pem"
        self.server_key = directory / "server.key"
        self.client_cert = directory / "client.pem"
        self.client_key = directory / "client.key"

    def make(self) -> TLSFiles:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)

        def openssl(*args: str) -> None:
            subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
                "-days", "2", "-subj", "/CN=ticketing test CA")
        (d / "server.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n"
                                      "extendedKeyUsage=serverAuth\n")
        (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
        for name in ("server", "client"):
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                    "-subj", f"/CN=ticketing test {name}")
            openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
        return self

    def client_context(self, *, with_cert: bool = False) -> ssl.SSLContext:
        """A client context that trusts the test CA (and presents the client certificate)."""
        ctx = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


class ServerProcess:
    """``<bin> server`` on 127.0.0.1 with a free port, stopped with SIGTERM (by its PID).
    ``TICKETING_STARTUP_GRACE=0`` unless ``env`` says otherwise, so a restart grants at once."""

    def __init__(self, binary: Path, data_dir: Path, *, token: str | None = None, tls: TLSFiles | None = None,
                 mtls: bool = False, env: dict[str, str] | None = None) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.token = token
        self.tls = tls
        self.mtls = mtls
        self.extra_env = {"TICKETING_STARTUP_GRACE": "0", **(env or {})}
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
        if self.tls is not None:
            env["TICKETING_TLS_CERT"] = str(self.tls.server_cert)
            env["TICKETING_TLS_KEY"] = str(self.tls.server_key)
            if self.mtls:
                env["TICKETING_TLS_CLIENT_CA"] = str(self.tls.ca)
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
        with proc.stderr, open(self.data_dir / "server.log", "a", encoding="utf-8") as logfile:
            for line in proc.stderr:
                logfile.write(line)
                logfile.flush()
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

    def restart(self, *, graceful: bool = False) -> ServerProcess:
        """Stop (SIGTERM, or SIGKILL) and start again on the same port and data directory."""
        addr = self.addr
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start(addr=addr)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the server process (SIGSTOP / SIGCONT for a frozen server); after
        SIGSTOP, wait until the process is stopped (its state in /proc is ``T``)."""
        assert self._proc is not None
        pid = self._proc.pid
        os.kill(pid, sig)
        if sig != signal.SIGSTOP:
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
            time.sleep(0.002)
        raise RuntimeError(f"server {pid} did not stop after SIGSTOP")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None
