"""Shared small models and compiled captures for the forecast tests (module-scoped where compiled)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn


def make_mlp(width: int = 256, depth: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def make_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    )


@pytest.fixture(scope="session", name="make_mlp")
def _make_mlp_fixture():  # noqa: ANN202
    return make_mlp


@pytest.fixture(scope="session", name="make_cnn")
def _make_cnn_fixture():  # noqa: ANN202
    return make_cnn


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*TF32.*")
    warnings.filterwarnings("ignore", message=".*Memory block of unknown size.*")
