"""Shared fixtures: CUDA-marked tests skip with a reason on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

NO_CUDA_REASON = f"needs a CUDA device: torch.cuda.is_available() is False (torch {torch.__version__})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA_REASON))


def devices() -> list:
    """cpu, plus cuda (marked, so it skips with a reason where there is none)."""
    return ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
