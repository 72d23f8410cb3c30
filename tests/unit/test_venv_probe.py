"""One venv probe for nvidia_env and hf_fetch (issue 21): what the venv's own python reports, and whether it is
already what the role pins."""

from __future__ import annotations

import importlib.metadata
import sys

from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.venv_probe import judge, pin_name, probe

PYYAML = importlib.metadata.version("PyYAML")


def test_current_only_when_every_exact_pin_is_installed_and_nothing_forbidden_is():
    have = {"vllm": "0.19.1", "torchvision": None, "huggingface_hub": "2.4.0"}
    assert judge(have, ["vllm==0.19.1", "huggingface_hub==2.4.0"], ["torchvision"]) == (True, [])
    assert judge(have, ["vllm==0.19.0"], []) == (False, ["vllm is 0.19.1, pinned 0.19.0"])
    assert judge({"vllm": None}, ["vllm==0.19.1"], []) == (False, ["vllm is not installed, pinned 0.19.1"])
    assert judge({"vllm": "0.19.1", "torchvision": "0.24.0"}, ["vllm==0.19.1"], ["torchvision"]) == (
        False, ["torchvision 0.24.0 is installed and must not be"])
    # a pin that is not exact is never current: pip decides
    assert judge({"vllm": "0.19.1"}, ["vllm>=0.19"], []) == (False, ["vllm>=0.19 is not an exact name==version pin"])
    assert judge(None, ["vllm==0.19.1"], []) == (False, ["the venv's python did not answer (no venv yet)"])


def test_pin_names():
    assert [pin_name(s) for s in ("vllm==0.19.1", "torch==2.13.0+cpu", "a[b]>=1", " x ")] == ["vllm", "torch", "a",
                                                                                             "x"]


def test_the_probe_asks_the_venvs_own_python():
    got = probe(sys.executable, ["pyyaml", "PyYAML", "no-such-dist-xyz"])
    assert got == {"pyyaml": PYYAML, "PyYAML": PYYAML, "no-such-dist-xyz": None}
    assert probe("/nonexistent/bin/python", ["x"]) is None
    assert judge(probe(sys.executable, ["PyYAML"]), [f"PyYAML=={PYYAML}"], ["no-such-dist-xyz"]) == (True, [])
