"""pytest setup of the jfa Python tests.

The tests import the package from python/ in this checkout (set JFA_TEST_INSTALLED=1 to test an
installed jfa instead). The library is found by jfa's own search: $JFA_LIBRARY, the copy inside
the package, then build/release/src and build/cpu/src. Inputs are random; the base seed is printed
in the header and can be fixed with JFA_TEST_SEED.
"""

import os
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if not os.environ.get("JFA_TEST_INSTALLED"):
    sys.path.insert(0, str(ROOT / "python"))

BASE_SEED = int(os.environ.get("JFA_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))


def pytest_report_header(config):
    import jfa

    try:
        lib = jfa.library_path()
        cuda = jfa.cuda_available()
    except Exception as e:  # reported again, as a failure, by the tests
        lib, cuda = f"NOT LOADED ({e})", False
    torch_line = "available" if jfa.torch_available() else jfa.torch_unavailable_reason()
    return [f"jfa: package {Path(jfa.__file__).parent}", f"jfa: library {lib}",
            f"jfa: CUDA backend usable: {cuda}; torch: {torch_line}",
            f"jfa: JFA_TEST_SEED={BASE_SEED}"]


@pytest.fixture
def seed(request):
    """A per-test seed derived from the base seed and the test id (printed on failure)."""
    s = (BASE_SEED + zlib.crc32(request.node.nodeid.encode())) % 2**32
    print(f"seed={s} (JFA_TEST_SEED={BASE_SEED})")
    return s


@pytest.fixture
def rng(seed):
    import numpy as np

    return np.random.default_rng(seed)
