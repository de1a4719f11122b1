"""The README's GPU section gives the two device calls ready to paste: each command fits the
device tool's 2,000 characters and names scripts that exist, and each carries the kit's common
part plus its own SmolLM2 part, from a git-ignored folder (only such paths can be carried)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]


def device_calls() -> list[dict]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## GPU checks", 1)[1].split("\n## ", 1)[0]
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", section, re.S)]


def test_two_calls_each_under_2000_characters_naming_scripts_that_exist():
    calls = device_calls()
    assert [re.search(r"--phase (\d)", c["command"])[1] for c in calls] == ["1", "2"]  # type: ignore[index]
    for call in calls:
        assert len(call["command"]) <= 2000
        assert 0 < call["timeout_s"] <= 600
        scripts = re.findall(r"scripts/\S+", call["command"])
        assert scripts and all((REPO / s).is_file() for s in scripts), call["command"]


@pytest.mark.e2e
def test_each_call_carries_the_common_part_and_its_own_model_part(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"gguf" * 1000)
    kit = tmp_path / ".gpukit"
    subprocess.run(["bash", str(REPO / "scripts" / "gpu" / "kit.sh"), "split", str(model),
                    str(kit)], check=True, capture_output=True)  # fmt: skip
    for i, call in enumerate(device_calls(), start=1):
        assert call["carry"] == [".gpukit/common", f".gpukit/part{i}"]
        assert len(call["carry"]) <= 8
        assert all((tmp_path / p).is_dir() for p in call["carry"]), "kit.sh lays the kit out so"


@pytest.mark.e2e
@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout"
)
def test_the_kit_folder_is_git_ignored_so_that_it_can_be_carried():
    res = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", ".gpukit/common"])
    assert res.returncode == 0
