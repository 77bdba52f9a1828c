"""The scripts that build and test the tree say what they run."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_test_sh_step_headings_say_what_runs():
    """scripts/test.sh heads each step with what it runs, not with what it might skip: a step that
    can skip (torch-cpu-tests.sh without torch, say) prints its own reason when it does."""
    script = ROOT / "scripts" / "test.sh"
    if not script.is_file():
        pytest.skip("not a source checkout")
    headings = re.findall(r'^\s*echo "== (.*)"$', script.read_text(), re.M)
    assert headings, "no step headings found"
    for heading in headings:
        assert "skipped" not in heading, heading
    (torch_step,) = [h for h in headings if h.startswith("torch op library")]
    assert "native ops, then JFA_TORCH_OPS=ctypes" in torch_step, torch_step
