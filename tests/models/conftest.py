"""Fixtures for the models tests: a local HTTP server serving files from a temp folder."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path

import pytest
import torch


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - signature of the base class
        pass


@pytest.fixture
def http_files(tmp_path):
    """Yield ``(serve_dir, base_url)``: files put in ``serve_dir`` are served at ``base_url/NAME``."""
    serve_dir = tmp_path / "served"
    serve_dir.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(serve_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield serve_dir, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def _no_proxy_for_localhost(monkeypatch):
    # urllib honours *_proxy variables; the local test server must be reached directly.
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _randomize(module: torch.nn.Module, seed: int = 1234) -> torch.nn.Module:
    """Give every parameter and float buffer random values in [0.5, 1.5), so that loaded
    weights are distinguishable from a fresh initialisation (and BN variances stay > 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
            t.copy_(torch.rand(t.shape, generator=g) + 0.5)
    return module


@pytest.fixture
def randomize():
    return _randomize


@pytest.fixture
def files_in():
    def _files(directory: Path) -> list[str]:
        return sorted(p.name for p in Path(directory).iterdir())

    return _files
