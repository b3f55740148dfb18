import os

import pytest
import torch

import flashattn_torch
from attn_reference import CUDA
from flashattn_torch import ops


def pytest_report_header(config):
    where = "CPU and CUDA" if CUDA else "CPU only (no CUDA GPU or the library has no CUDA backend: CUDA tests skip)"
    return [f"flashattn_torch: library {flashattn_torch.library_path}; torch {torch.__version__}; {where}"]


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every test runs with the binding's outputs NaN-filled before the library writes them."""
    monkeypatch.setattr(ops, "poison_outputs", True)


@pytest.fixture(autouse=True)
def seeded(request):
    """A fresh seed per test (FLASHATTN_TEST_SEED to reproduce); printed when a test fails."""
    seed = int(os.environ.get("FLASHATTN_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    torch.manual_seed(seed)
    request.node.user_properties.append(("seed", seed))
    yield seed


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            report.sections.append(("seed", f"reproduce with FLASHATTN_TEST_SEED={seeds[0]}"))

