"""The published package: package.sh builds the sdist and the wheel (twine check --strict passes,
no warning), they carry the library, README.md, LICENSE and py.typed and nothing of the
repository, the metadata is complete, and the wheel installed into a fresh venv (no index, no
checkout on the path) runs the README's first example against the real server and type-checks
under mypy --strict from the installed py.typed."""

from __future__ import annotations

import email.parser
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import ticketing

from .server import REPO, ServerProcess

HERE = Path(__file__).resolve().parents[1]
README = (HERE / "README.md").read_text(encoding="utf-8")
PYPROJECT = tomllib.loads((HERE / "pyproject.toml").read_text(encoding="utf-8"))["project"]
VERSION = (REPO / "VERSION").read_text(encoding="utf-8").strip()
NAME = PYPROJECT["name"]
STEM = f"{NAME.replace('-', '_')}-{VERSION}"
REPO_URL = "https://github.com/ticketing/ticketing"


@dataclass
class Artifacts:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([str(HERE / "package.sh"), str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = sorted(Path(line) for line in proc.stdout.splitlines())
    assert printed == [out / f"{STEM}-py3-none-any.whl", out / f"{STEM}.tar.gz"], proc.stdout
    assert proc.stderr.count("PASSED") == 2, proc.stderr
    return Artifacts(wheel=out / f"{STEM}-py3-none-any.whl", sdist=out / f"{STEM}.tar.gz")


def test_versions_agree() -> None:
    assert VERSION == "0.3.0"
    assert PYPROJECT["version"] == VERSION
    assert ticketing.__version__ == VERSION


def test_wheel_contents_and_metadata(artifacts: Artifacts) -> None:
    with zipfile.ZipFile(artifacts.wheel) as whl:
        names = whl.namelist()
        meta = email.parser.Parser().parsestr(whl.read(f"{STEM}.dist-info/METADATA").decode())
        assert whl.read(f"{STEM}.dist-info/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
    assert "ticketing/py.typed" in names
    assert "ticketing/asyncio/client.py" in names
    assert {n.split("/")[0] for n in names} == {"ticketing", f"{STEM}.dist-info"}, names
    assert meta["Metadata-Version"] == "2.4"
    assert meta["Name"] == NAME
    assert meta["Version"] == VERSION
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["Author"] == "The Ticketing authors"
    assert meta["Summary"].startswith("Client for Ticketing, a distributed lock server")
    assert meta["Description-Content-Type"] == "text/markdown"
    assert dict(u.split(", ", 1) for u in meta.get_all("Project-URL", [])) == {
        "Homepage": REPO_URL,
        "Repository": REPO_URL,
        "Documentation": f"{REPO_URL}/tree/main/clients/python",
        "Issues": f"{REPO_URL}/issues",
    }
    classifiers = meta.get_all("Classifier", [])
    for c in ("Typing :: Typed", "Programming Language :: Python :: 3.11", "Operating System :: OS Independent"):
        assert c in classifiers
    assert not meta.get_all("Requires-Dist"), "the client has no dependencies"
    assert not meta.get_all("Provides-Extra"), "dev tools are a dependency group, not a published extra"
    assert meta.get_payload() == README


def test_sdist_has_the_library_only(artifacts: Artifacts) -> None:
    with tarfile.open(artifacts.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    top = {n.split("/")[0] for n in names}
    assert top == {"LICENSE", "MANIFEST.in", "PKG-INFO", "README.md", "pyproject.toml", "setup.cfg", "src"}, top
    assert "src/ticketing/py.typed" in names
    assert {n.split("/")[1] for n in names if n.startswith("src/")} == {"ticketing", "ticketing_client.egg-info"}


def test_readme_install_section(artifacts: Artifacts) -> None:
    install = README.split("## Install", 1)[1].split("\n## ", 1)[0]
    assert f"pip install {NAME}\n" in install
    assert f"pip install dist/python/{artifacts.wheel.name}" in install
    assert "clients/python/package.sh" in install
    # The README is the registry page: no link relative to the repository.
    assert not re.search(r"\]\((?!https://|#)", README), "a relative link breaks on the registry page"


def first_example() -> str:
    section = README.split("## Connect, lock, release", 1)[1]
    m = re.search(r"^```python\n(.*?)^```", section, re.M | re.S)
    assert m is not None
    return m.group(1)


def test_wheel_in_a_fresh_venv_runs_the_readme_example(artifacts: Artifacts, server: ServerProcess,
                                                      tmp_path: Path) -> None:
    # A fresh venv (without its own pip: the test venv's pip installs into it through --python,
    # seconds faster than ensurepip) and a project folder holding only the README's example.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKETING_", "PYTHON", "PIP_"))}
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(py),
                           "install", "--no-index", str(artifacts.wheel)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    project = tmp_path / "project"
    project.mkdir()
    example = project / "example.py"
    example.write_text(first_example(), encoding="utf-8")

    where = subprocess.run([str(py), "-c", "import importlib.metadata as m, ticketing; "
                            f"print(ticketing.__file__, m.version({NAME!r}))"],
                           cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(venv / "lib")) and where.stdout.split()[-1] == VERSION, where.stdout

    run = subprocess.run([str(py), str(example)], cwd=project, env={**env, "TICKETING_ADDR": server.addr},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert re.fullmatch(r"holding order-1234 with fencing token [1-9][0-9]*\n", run.stdout), run.stdout

    # The installed package is typed: mypy --strict resolves ticketing through the fresh venv's
    # py.typed (without it: "module is installed, but missing library stubs or py.typed marker").
    typed = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                            "--python-executable", str(py), str(example)],
                           cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert typed.returncode == 0, typed.stdout + typed.stderr
