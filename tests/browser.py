"""Headless Chromium for tests, driven over the DevTools protocol on a pipe.

``--remote-debugging-pipe`` speaks the DevTools protocol (CDP) on file descriptors 3 (commands
in) and 4 (replies and events out), one JSON message per NUL-terminated chunk: no port, no
websocket library, nothing reachable from outside the test. ``open_page`` loads a page, waits
until the page marks itself drawn, and returns what a test checks: every console error,
uncaught exception, failed or outside request and JavaScript dialog, plus the page's own
answers to ``Runtime.evaluate`` and a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def install_chromium() -> tuple[str | None, str]:
    """The system Chromium, installed from Debian's packages when missing (needs root and
    apt-get); returns (path or None, why not)."""
    path = find_chromium()
    if path:
        return path, ""
    if not shutil.which("apt-get"):
        return None, "no chromium on PATH and no apt-get to install it"
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return None, "no chromium on PATH, and installing it needs root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    log = []
    for cmd in (["apt-get", "install", "-y", "-q", "chromium"], ["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "chromium"]):
        try:
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, f"{' '.join(cmd)} failed: {e}"
        log.append(r.stderr.strip().splitlines()[-1:] if r.returncode else [])
        if cmd[1] == "install" and r.returncode == 0 and find_chromium():
            return find_chromium(), ""
    return None, f"apt-get install chromium failed: {log}"


@dataclass
class PageResult:
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    failed_requests: list[str] = field(default_factory=list)
    outside_requests: list[str] = field(default_factory=list)  # anything but the page, data: and blob:
    dialogs: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None


class _Cdp:
    def __init__(self, chromium: str, profile: str) -> None:
        import fcntl

        def high(fd: int) -> int:  # above 4, so that moving the child's ends to 3 and 4 clobbers neither
            moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
            os.close(fd)
            return moved

        to_child_r, self._w = (high(fd) for fd in os.pipe())
        self._r, from_child_w = (high(fd) for fd in os.pipe())

        def fds() -> None:  # the child's fd 3 reads our commands, its fd 4 writes its replies
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,2000", "--hide-scrollbars", "about:blank"]
        self.proc = subprocess.Popen(argv, preexec_fn=fds, pass_fds=(3, 4),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._id = 0
        self._dialogs = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._id += 1
        msg: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._next(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self._event(m)

    def pump(self, seconds: float) -> None:
        """Read events for ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self._event(self._next(deadline))
        except TimeoutError:
            pass

    def _event(self, m: dict) -> None:
        self.events.append(m)
        if m.get("method") == "Page.javascriptDialogOpening":
            # a dialog blocks the page: record it (the test fails on it) and dismiss it
            self._dialogs += 1
            reply = {"id": 10**9 + self._dialogs, "method": "Page.handleJavaScriptDialog",
                     "params": {"accept": False}, "sessionId": m.get("sessionId")}
            os.write(self._w, json.dumps(reply).encode() + b"\0")

    def _next(self, deadline: float) -> dict:
        import select

        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from chromium in time")
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 20)
                if not chunk:
                    raise RuntimeError("chromium closed the DevTools pipe")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)
        os.close(self._w)
        os.close(self._r)


def open_page(chromium: str, page: Path, *, ready_js: str, probes: dict[str, str], screenshot: Path | None = None,
              timeout: float = 90) -> PageResult:
    """Load ``page`` (a file), wait until ``ready_js`` evaluates truthy, evaluate each of
    ``probes`` (name -> expression returning JSON-able values) and take a full-page
    screenshot; everything the browser reported on the way is in the result."""
    url = page.resolve().as_uri()
    out = PageResult()
    with tempfile.TemporaryDirectory(prefix="proflab-chromium-") as profile:
        cdp = _Cdp(chromium, profile)
        try:
            target = cdp.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = cdp.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Runtime", "Log", "Network", "Page"):
                cdp.send(f"{domain}.enable", session=sid)
            cdp.send("Page.navigate", {"url": url}, session=sid)
            deadline = time.monotonic() + timeout
            ready = False
            while time.monotonic() < deadline:
                r = cdp.send("Runtime.evaluate", {"expression": f"Boolean({ready_js})", "returnByValue": True}, session=sid)
                if r.get("result", {}).get("value") is True:
                    ready = True
                    break
                cdp.pump(0.25)
            out.values["ready"] = ready
            cdp.pump(0.5)  # late console messages
            for name, expr in probes.items():
                r = cdp.send("Runtime.evaluate", {"expression": f"JSON.stringify({expr})", "returnByValue": True}, session=sid)
                v = r.get("result", {}).get("value")
                out.values[name] = None if v is None else json.loads(v)
            if screenshot is not None:
                shot = cdp.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=sid)
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(shot["data"]))
                out.screenshot = screenshot
        finally:
            cdp.close()
    for ev in cdp.events:
        method, p = ev.get("method"), ev.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.errors.append(f"exception: {d.get('text')} {d.get('exception', {}).get('description', '')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        elif method == "Network.loadingFailed":
            out.failed_requests.append(f"{p.get('errorText')} {p.get('blockedReason', '')}")
        elif method == "Network.requestWillBeSent":
            u = p.get("request", {}).get("url", "")
            if u != url and not u.startswith(("data:", "blob:")):
                out.outside_requests.append(u)
        elif method == "Page.javascriptDialogOpening":
            out.dialogs.append(f"{p.get('type')}: {p.get('message')}")
    return out
