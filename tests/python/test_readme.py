"""The README's Python examples run as written: the numpy one everywhere, the torch ones marked
"# CPU example" where torch is present, the other torch one where a usable CUDA backend is too,
the transformers one where transformers is installed."""

import re
from pathlib import Path

import pytest

import jfa

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(transformers=False):
    """The README's Python examples, those with transformers or those without."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return [b for b in blocks if ("import transformers" in b) == transformers]


def test_readme_has_both_examples():
    blocks = python_blocks()
    assert any("import torch" in b for b in blocks)
    assert any("import numpy" in b and "import torch" not in b for b in blocks)


def test_numpy_example_runs():
    for block in python_blocks():
        if "import torch" not in block:
            exec(compile(block, "README.md (numpy example)", "exec"), {})


def test_torch_cpu_example_runs():
    if not jfa.torch_available():
        pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}")
    blocks = [b for b in python_blocks() if "import torch" in b and "# CPU example" in b]
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md (torch CPU example)", "exec"), {})


def test_torch_example_runs():
    if not jfa.torch_available():
        pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}")
    if not jfa.cuda_available():
        pytest.skip("no usable CUDA backend (needs a Hopper GPU and a CUDA build of libjfa)")
    for block in python_blocks():
        if "import torch" in block and "# CPU example" not in block:
            exec(compile(block, "README.md (torch example)", "exec"), {})


def test_transformers_example_runs():
    pytest.importorskip("transformers", reason="transformers is not installed")
    if not jfa.torch_available():
        pytest.skip(f"torch path unavailable: {jfa.torch_unavailable_reason()}")
    blocks = python_blocks(transformers=True)
    assert blocks
    import inspect

    import transformers
    batching = getattr(transformers, "ContinuousBatchingConfig", None)
    paged_config = batching is not None and "page_size" in inspect.signature(batching).parameters
    ran = 0
    for block in blocks:
        if "generate_batch" in block and not paged_config:
            continue  # the continuous-batching example needs transformers 5.25's API (page_size)
        exec(compile(block, "README.md (transformers example)", "exec"), {})
        ran += 1
    assert ran > 0
    if not paged_config:
        pytest.skip(f"the continuous-batching example needs transformers 5.25's "
                    f"ContinuousBatchingConfig(page_size=...); transformers "
                    f"{transformers.__version__} has none (the other examples ran)")
