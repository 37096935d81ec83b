"""Locate the shared protocol files (never copied): <repo>/protocol/*.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
PROTOCOL_DIR = REPO / "protocol"


def load(name: str) -> Any:
    with open(PROTOCOL_DIR / name, encoding="utf-8") as f:
        return json.load(f)
