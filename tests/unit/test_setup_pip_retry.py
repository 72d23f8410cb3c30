"""scripts/lib/pip.sh's pip_run: the set-up survives a mirror's corrupt download and still fails on a real error.

CI once went red in its first minute because a package mirror served a wheel whose bytes did not match its
published hash (pip: "THESE PACKAGES DO NOT MATCH THE HASHES"); a second download was correct. The command under
test here is a small script standing in for pip's exit status only: it fails a chosen number of times, the way
pip does on such a download, and records the environment each attempt ran with.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "scripts" / "lib" / "pip.sh"

FAKE_PIP = """#!/usr/bin/env bash
n=$(cat "$STATE/count" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$STATE/count"
echo "attempt=$n no_cache=${PIP_NO_CACHE_DIR:-unset} args=$*" >> "$STATE/calls"
echo "Link requires a different Python: is ignored: it is neither a file nor a directory"
if [ "$n" -le "$FAILS" ]; then
  echo "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE (attempt $n)"; exit 1
fi
echo "installed on attempt $n"
"""


def _run(tmp_path: Path, fails: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    fake = tmp_path / "pip"
    fake.write_text(FAKE_PIP)
    fake.chmod(0o755)
    script = f'set -euo pipefail; . "{LIB}"; pip_run "{fake}" install -q demo; echo "after rc=0"'
    proc = subprocess.run(
        ["bash", "-c", script],
        env={"PATH": "/usr/bin:/bin", "STATE": str(tmp_path), "FAILS": str(fails),
             "MODELFLEET_PIP_RETRY_PAUSE": "0"},
        capture_output=True, text=True, timeout=60,
    )
    calls = (tmp_path / "calls").read_text().splitlines()
    return proc, calls


def test_a_corrupt_download_is_retried_without_the_cache(tmp_path):
    proc, calls = _run(tmp_path, fails=2)
    assert proc.returncode == 0, proc.stderr
    assert "after rc=0" in proc.stdout
    assert calls == [
        "attempt=1 no_cache=unset args=install -q demo",
        "attempt=2 no_cache=1 args=install -q demo",
        "attempt=3 no_cache=1 args=install -q demo",
    ]
    assert "attempt 1 of 3 failed" in proc.stderr and "attempt 2 of 3 failed" in proc.stderr
    assert "installed on attempt 3" in proc.stderr
    assert "is ignored: it is neither" not in proc.stderr


def test_success_first_time_runs_pip_once(tmp_path):
    proc, calls = _run(tmp_path, fails=0)
    assert proc.returncode == 0
    assert calls == ["attempt=1 no_cache=unset args=install -q demo"]
    assert "failed" not in proc.stderr


def test_a_real_error_fails_after_three_attempts_with_pips_status_and_output(tmp_path):
    proc, calls = _run(tmp_path, fails=99)
    assert proc.returncode == 1
    assert "after rc=0" not in proc.stdout
    assert len(calls) == 3
    assert proc.stderr.rstrip().endswith("DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE (attempt 3)")
