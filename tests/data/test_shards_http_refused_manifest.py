"""A folder URL (`convert shards`' manifest.json lists its shards) whose server refuses the
manifest (a wrong password's 401): the run said "no manifest.json lies there", sending the
user to look for a file that is there rather than at the login. It is the refusal, one error
line naming the manifest and the status; a folder without one still says there is none."""

from __future__ import annotations

import pytest
from output_checks import error_line
from processes import run_torchkit_in_process
from shards import serving


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A real local http.server over an empty folder (`/auth/...` answers 401 to a request
    without the Basic credentials `me:p w`, `tests/helpers/shards.py`)."""
    (tmp_path / "served" / "empty").mkdir(parents=True)
    with serving(tmp_path / "served", tmp_path / "cache", monkeypatch) as httpd:
        yield httpd


def test_a_folder_urls_manifest_refused_is_that_refusal(server):
    host = server.url.removeprefix("http://")
    refused = run_torchkit_in_process(
        "dataset-stats", f"http://me:wrong@{host}/auth/empty", "--workers", "0"
    )
    assert refused.returncode == 1
    line = error_line(refused.stderr)
    assert f"http://me:***@{host}/auth/empty/manifest.json: HTTP 401" in line, line
    assert "wrong" not in line and "no manifest.json lies there" not in line, line
    missing = run_torchkit_in_process("dataset-stats", f"{server.url}/empty", "--workers", "0")
    assert missing.returncode == 1
    assert "and no manifest.json lies there" in error_line(missing.stderr)
