"""Start and stop `deepinfer serve` for the end-to-end tests."""
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

from conftest import BIN, ROOT

FIXTURES = ROOT / "tests" / "fixtures" / "model"


class Server:
    def __init__(self, *args, env=None, preexec_fn=None):
        """preexec_fn runs in the child before exec (resource limits in the fault tests)"""
        self.args = [str(BIN), "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=preexec_fn, env={**os.environ, **(env or {})})
        self.log = []
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log) + self.proc.stderr.read())
        # keep draining the log so the server never blocks on a full pipe
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()
        import json
        self.model = json.loads(self.get("/v1/models")[1])["data"][0]["id"]

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return r.status, r.read().decode()

    def metric(self, name):
        _, text = self.get("/metrics")
        for line in text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
