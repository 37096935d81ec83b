"""Fixtures: the real server (built once per session unless TICKETING_BIN names it), plain, with
a token, with TLS and with mutual TLS (certificates made at test time), and a server per test."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from .server import TOKEN, ServerProcess, TLSFiles, build_server


@pytest.fixture(scope="session")
def server_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_server(tmp_path_factory.mktemp("bin"))


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TLSFiles:
    return TLSFiles(tmp_path_factory.mktemp("tls")).make()


_count = itertools.count()


def _start(server_bin: Path, tmp: pytest.TempPathFactory, **kw: object) -> ServerProcess:
    return ServerProcess(server_bin, tmp.mktemp(f"data{next(_count)}"), **kw).start()  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def server(server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A plain server without auth, shared by the session (tests use keys of their own)."""
    s = _start(server_bin, tmp_path_factory)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def auth_server(server_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = _start(server_bin, tmp_path_factory, token=TOKEN)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def tls_server(server_bin: Path, tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles
               ) -> Iterator[ServerProcess]:
    s = _start(server_bin, tmp_path_factory, token=TOKEN, tls=tls_files)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def mtls_server(server_bin: Path, tmp_path_factory: pytest.TempPathFactory, tls_files: TLSFiles
                ) -> Iterator[ServerProcess]:
    s = _start(server_bin, tmp_path_factory, tls=tls_files, mtls=True)
    yield s
    s.stop()


@pytest.fixture
def own_server(server_bin: Path, tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of this test's own, which the test may stop, kill or restart."""
    s = ServerProcess(server_bin, tmp_path / "data").start()
    yield s
    s.stop()


@pytest.fixture
def key() -> str:
    """A key no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}"
