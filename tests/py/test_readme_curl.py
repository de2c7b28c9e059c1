"""The README's curl examples work as written (only the port changes)."""
import json
import re
import subprocess
import tempfile

import pytest

from conftest import BIN, ROOT
from serve_util import Server


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- curl-examples")[1].split("<!-- end curl-examples -->")[0]
    block = block.split("```sh\n", 1)[1].rsplit("```", 1)[0]
    cmds, cur = [], ""
    for line in block.splitlines():
        cur += line[:-1] + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            if cur.strip():
                cmds.append(cur.strip())
            cur = ""
    return cmds


@pytest.fixture(scope="module")
def tiny_server():
    with tempfile.TemporaryDirectory() as td:
        d = f"{td}/tiny"  # the name the README's requests use
        subprocess.run([str(BIN), "make-tiny-model", d], check=True, capture_output=True)
        s = Server("--model", d, "--threads", "2")
        yield s
        assert s.stop() == 0


def test_readme_has_examples():
    cmds = readme_commands()
    assert len(cmds) >= 6 and all(c.startswith("curl ") for c in cmds)


@pytest.mark.parametrize("i", range(6))
def test_readme_curl(tiny_server, i):
    cmd = readme_commands()[i].replace("127.0.0.1:8000", f"127.0.0.1:{tiny_server.port}")
    p = subprocess.run(["bash", "-c", cmd + " -w '\\n%{http_code}'"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    body, code = p.stdout.rsplit("\n", 1)
    assert code == "200", body
    if "/metrics" in cmd:
        assert "deepinfer_requests_total" in body
    elif '"stream":true' in cmd:
        events = [l[6:] for l in body.splitlines() if l.startswith("data: ")]
        assert events[-1] == "[DONE]" and all(json.loads(e) for e in events[:-1])
    else:
        j = json.loads(body)
        assert not isinstance(j.get("error"), dict), j  # (Responses objects carry "error": null)
