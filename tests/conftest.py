"""Shared fixtures. Real parts only: a tiny model built offline, real files, real servers."""
from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def tiny_model_path():
    """Directory of the tiny Qwen2 model + byte-level BPE tokenizer (built once, cached)."""
    from forksight.trainer.model import build_tiny

    return build_tiny()


@pytest.fixture()
def tiny(tiny_model_path):
    """A fresh (model, tokenizer) pair loaded through from_pretrained."""
    from forksight.trainer.model import load

    return load(tiny_model_path)


def require_browser() -> str:
    """Path to Debian's chromium; skips locally when absent, fails in CI where it must exist."""
    path = "/usr/bin/chromium"
    if not os.path.exists(path):
        if os.environ.get("FORKSIGHT_REQUIRE_BROWSER"):
            pytest.fail("chromium is required in CI: apt-get install -y chromium chromium-driver")
        pytest.skip("chromium not installed (apt-get install -y chromium chromium-driver)")
    return path


@pytest.fixture()
def collector(tmp_path):
    """A real `forksight serve` subprocess on a free loopback port over tmp_path/collector.duckdb
    (API only; use collector_util.ServeProcess(..., dashboard=True) for the dashboard)."""
    from collector_util import ServeProcess

    with ServeProcess(tmp_path / "collector.duckdb") as srv:
        yield srv


@pytest.fixture(scope="module")
def one_torch_thread():
    """The tiny model gains nothing from intra-op threads, and on a busy 2-core machine their
    spinning workers fight other processes (runs got 3-9x slower): one thread, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def http(srv):
    """An HTTP client on the module's `srv` collector (each module defines `srv`)."""
    import httpx

    with httpx.Client(base_url=srv.url, timeout=60) as client:
        yield client
