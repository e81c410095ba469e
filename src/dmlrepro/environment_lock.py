"""The locked environment (requirements.lock at the repository's root, docs/environment.md): the
versions it pins and how the running environment differs from them; a report's provenance lists both."""

from __future__ import annotations

import hashlib
import re
from importlib import metadata
from pathlib import Path
from typing import Any

LOCK_FILE = "requirements.lock"
#: installed but never locked: the installer's own tools and the project itself (installed editable)
UNLOCKED = {"pip", "wheel", "dmlrepro"}


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (Foo_Bar -> foo-bar)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_versions(path: str | Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a pip-compile lock file."""
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", Path(path).read_text(), re.MULTILINE)
    return {normalized(name): version for name, version in pins}


def installed_versions() -> dict[str, str]:
    """name -> version of every distribution in this interpreter's environment."""
    return {normalized(dist.metadata["Name"]): dist.version for dist in metadata.distributions()}


def lock_differences(path: str | Path, installed: dict[str, str] | None = None) -> list[str]:
    """How the environment differs from the lock, one line per package (empty: exactly the lock)."""
    locked = locked_versions(path)
    installed = installed_versions() if installed is None else installed
    out = [
        f"{name}: locked {version}, installed {installed.get(name, 'nothing')}"
        for name, version in sorted(locked.items())
        if installed.get(name) != version
    ]
    out += [
        f"{name}: installed {version}, not locked"
        for name, version in sorted(installed.items())
        if name not in locked and name not in UNLOCKED
    ]
    return out


def lock_record(repo: str | Path) -> dict[str, Any]:
    """The provenance's `lock`: the lock file's sha256, its pins and how this environment differs."""
    path = Path(repo) / LOCK_FILE
    if not path.is_file():
        return {"file": LOCK_FILE, "sha256": None, "locked": {}, "differences": [f"no {LOCK_FILE} in {repo}"]}
    return {
        "file": LOCK_FILE,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "locked": locked_versions(path),
        "differences": lock_differences(path),
    }
