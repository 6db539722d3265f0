"""A small client of a JupyterHub for class/tests/test_hub.py: a browser's login form (cookies, the
_xsrf field), the hub's REST API, and one Jupyter kernel driven through the hub's proxy over its
websocket, as JupyterLab drives it. Standard library plus tornado (which Jupyter brings)."""
from __future__ import annotations

import asyncio
import http.cookiejar
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a test looks at each redirect itself


class Browser:
    """One person's browser session on the hub at ``base`` (http://127.0.0.1:PORT)."""

    def __init__(self, base: str, language: str | None = None):
        self.base = base
        self.language = language  # the browser's Accept-Language header, if any
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect)
        self.token = None

    def _xsrf(self) -> str | None:
        return next((c.value for c in self.jar if c.name == "_xsrf"), None)

    def request(self, method: str, path: str, form: dict | None = None, data=None,
                timeout: float = 60) -> tuple[int, object, bytes]:
        headers, body = {}, None
        if form is not None:
            body = urllib.parse.urlencode({**form, "_xsrf": self._xsrf() or ""}).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif data is not None:
            body = json.dumps(data).encode()
            headers["Content-Type"] = "application/json"
        if self.language:
            headers["Accept-Language"] = self.language
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        elif method != "GET" and self._xsrf():
            headers["X-XSRFToken"] = self._xsrf()
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers)
        try:
            with self.opener.open(req, timeout=timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def json(self, method: str, path: str, data=None):
        status, _, body = self.request(method, path, data=data)
        assert 200 <= status < 300, f"{method} {path}: {status} {body[:300]!r}"
        return json.loads(body) if body else None

    def log_in(self, name: str, password: str) -> str:
        """The login form; returns where the hub sends the browser next."""
        self.request("GET", "/hub/login")  # sets the _xsrf cookie
        status, headers, body = self.request("POST", "/hub/login", form={"username": name, "password": password})
        assert status == 302, f"login of {name}: {status} {re.sub(rb'<[^>]+>', b' ', body)[:400]!r}"
        return headers.get("Location", "")

    def change_password(self, old: str, new: str) -> str:
        """The change-password form; returns where the hub sends the browser next."""
        status, headers, body = self.request("POST", "/hub/change-password", form={
            "old_password": old, "new_password": new, "new_password_confirmation": new})
        assert status == 302, f"password change: {status} {re.sub(rb'<[^>]+>', b' ', body)[:400]!r}"
        return headers.get("Location", "")

    def start_server(self, name: str, timeout_s: float = 180) -> dict:
        status, _, body = self.request("POST", f"/hub/api/users/{name}/server")
        assert status in (201, 202, 400), f"start of {name}'s server: {status} {body[:300]!r}"  # 400: running
        return self.wait_ready(name, timeout_s)

    def wait_ready(self, name: str, timeout_s: float = 180) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            server = self.json("GET", f"/hub/api/users/{name}").get("servers", {}).get("", {})
            if server.get("ready"):
                return server
            time.sleep(0.5)
        raise AssertionError(f"{name}'s server was not ready in {timeout_s} s")

    def stop_server(self, name: str, timeout_s: float = 60) -> None:
        if not self.json("GET", f"/hub/api/users/{name}").get("servers"):
            return  # not running
        status, _, body = self.request("DELETE", f"/hub/api/users/{name}/server")
        assert status in (202, 204), f"stop of {name}'s server: {status} {body[:300]!r}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.json("GET", f"/hub/api/users/{name}").get("servers"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{name}'s server did not stop in {timeout_s} s")

    def make_token(self, name: str) -> None:
        """An API token of this user; later requests use it instead of the cookie."""
        self.token = self.json("POST", f"/hub/api/users/{name}/tokens", data={"note": "class/tests/test_hub.py"})["token"]


class Kernel:
    """One kernel of ``user``'s server, started through the hub's proxy and driven over its
    websocket with the Jupyter messaging protocol (execute_request, iopub replies)."""

    def __init__(self, browser: Browser, user: str):
        self.browser, self.user = browser, user
        self.id = browser.json("POST", f"/user/{user}/api/kernels", data={"name": "python3"})["id"]
        self.session = uuid.uuid4().hex

    def run(self, code: str, timeout_s: float = 180) -> dict:
        """Run ``code``; returns {"text": stdout+stderr+results, "error": "ename: evalue" or None,
        "died": True if the kernel's websocket closed before the reply}."""
        return asyncio.run(self._run(code, timeout_s))

    async def _run(self, code: str, timeout_s: float) -> dict:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect
        url = self.browser.base.replace("http", "ws", 1) + f"/user/{self.user}/api/kernels/{self.id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {self.browser.token}"}))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "username": self.user, "session": self.session,
                       "msg_type": "execute_request", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        text, error, deadline = [], None, time.monotonic() + timeout_s
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{self.user}: no reply in {timeout_s} s to {code[:80]!r}")
                try:
                    raw = await asyncio.wait_for(ws.read_message(), left)
                except asyncio.TimeoutError:
                    continue
                if raw is None:
                    return {"text": "".join(text), "error": error, "died": True}
                msg = json.loads(raw)
                if msg["header"]["msg_type"] == "status" and msg["content"]["execution_state"] in ("restarting", "dead"):
                    return {"text": "".join(text), "error": error, "died": True}  # the server's own notice
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if kind == "stream":
                    text.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    text.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    error = f"{content['ename']}: {content['evalue']}"
                elif kind == "status" and content["execution_state"] in ("idle", "dead"):
                    return {"text": "".join(text), "error": error, "died": content["execution_state"] == "dead"}
        finally:
            ws.close()

    def alive(self) -> bool:
        status, _, body = self.browser.request("GET", f"/user/{self.user}/api/kernels/{self.id}")
        return status == 200 and json.loads(body).get("execution_state") not in ("dead", None)
