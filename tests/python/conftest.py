# SPDX-License-Identifier: Apache-2.0
"""pytest setup: GPU tests carry the `gpu` marker (CI deselects them with -m 'not gpu');
selected without torch or a GPU they are skipped, never passed. The `torch` and `fs`
fixtures serve GPU test modules that do not define their own."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("gpu") is None:
            continue
        try:
            import torch
        except ImportError:
            item.add_marker(pytest.mark.skip(reason="gpu test: torch is not installed"))
            continue
        if not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="gpu test: no CUDA device"))
        elif torch.cuda.get_device_capability() < (9, 0):
            item.add_marker(pytest.mark.skip(reason="gpu test: needs compute capability >= 9.0"))


@pytest.fixture(scope="module")
def torch():
    import torch as torch_module
    return torch_module


@pytest.fixture(scope="module")
def fs(torch):
    import fusedstep
    return fusedstep
