"""The harness suite's fixtures: one mock model per test module (test_scenarios.py keeps one
of its own per test, since its scenarios script the model's delays)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.interop.gateway_rig import MockModelProcess


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MockModelProcess]:
    mock = MockModelProcess(tmp_path_factory.mktemp("model"))
    yield mock
    mock.stop()
