"""The API against its own contract: `GET /openapi.json` from a real `flotilla up --agents 3
--app examples/echo.toml` is validated with openapi-spec-validator (OpenAPI 3.1), then
every documented operation is called, and each answer's status must be one the document
lists for it, with the content type it names and, for JSON, a body its schema accepts
(jsonschema, draft 2020-12, as OpenAPI 3.1 uses).

    python3 tests/api/conformance.py --flotilla target/debug/flotilla

Every process started is ended by its process group, pass or fail.
"""

import argparse
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import jsonschema
from openapi_spec_validator import validate

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Up:
    """`flotilla up` in its own process group, with a fresh data dir."""

    def __init__(self, flotilla, args):
        self.data = tempfile.mkdtemp(prefix="flotilla-api-")
        env = dict(os.environ)
        env["PATH"] = os.path.dirname(os.path.abspath(flotilla)) + os.pathsep + env.get("PATH", "")
        self.log = open(os.path.join(self.data, "up.log"), "a")
        self.proc = subprocess.Popen(
            [flotilla, "up", "--listen", "127.0.0.1:0", "--data", self.data, *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        addr_file = os.path.join(self.data, "control.addr")
        deadline = time.time() + 30
        while not os.path.exists(addr_file):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"flotilla up did not start; see {self.data}/up.log")
            time.sleep(0.1)
        self.url = open(addr_file).read().strip()
        self.token = open(os.path.join(self.data, "api-token")).read().strip()

    def call(self, method, path, body=None, content_type=None, token=True):
        """`token`: True for the API token, False for none, or a token of its own."""
        headers = {}
        if token:
            headers["Authorization"] = f"Bearer {self.token if token is True else token}"
        data = None
        if isinstance(body, bytes):
            data = body
            headers["Content-Type"] = content_type or "application/octet-stream"
        elif body is not None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            headers["Content-Type"] = content_type or ("text/plain" if isinstance(body, str) else "application/json")
        req = urllib.request.Request(self.url + path, method=method.upper(), data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                return r.status, r.headers.get("content-type", ""), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("content-type", ""), e.read()

    def stop(self):
        agents = os.path.join(self.data, "agents")
        for f in os.listdir(agents) if os.path.isdir(agents) else []:
            if f.endswith(".pid"):
                try:
                    os.killpg(int(open(os.path.join(agents, f)).read().strip()), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(timeout=10)
        self.log.close()


def wait_until(what, fn, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def first_bytes(url, path, token):
    """The status line and headers of a stream that never ends (`/v1/events`)."""
    host, port = url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    lines = head.split(b"\r\n\r\n")[0].decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    return status, headers.get("content-type", "")


def check(spec, method, template, status, ctype, body, expect=None):
    """The answer against the operation's documented responses (and, given `expect`, the
    status it must have)."""
    op = spec["paths"][template][method]
    responses = op["responses"]
    where = f"{method.upper()} {template} -> {status}"
    if expect is not None:
        assert status == expect, f"{where}: expected {expect}: {body[:300]!r}"
    assert str(status) in responses, f"{where}: not a documented status ({sorted(responses)}): {body[:300]!r}"
    if status == 404:
        # The router's fallback: a documented path that no route serves.
        assert json.loads(body)["error"]["code"] != "not_found", f"{where}: no route serves it"
    content = responses[str(status)].get("content")
    if not content:
        return
    mime = ctype.split(";")[0].strip()
    assert mime in content, f"{where}: content type {ctype!r}, documented {sorted(content)}"
    schema = content[mime].get("schema")
    if mime == "application/json" and schema is not None:
        doc = json.loads(body)
        root = dict(schema)
        root["components"] = spec.get("components", {})
        try:
            jsonschema.Draft202012Validator(root).validate(doc)
        except jsonschema.ValidationError as e:
            raise AssertionError(f"{where}: the answer does not match its schema: {e.message} at {list(e.absolute_path)}\n{json.dumps(doc)[:800]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flotilla", required=True)
    a = p.parse_args()
    up = Up(a.flotilla, ["--agents", "3", "--shards", "1", "--app", os.path.join(ROOT, "examples", "echo.toml")])
    try:
        status, _, raw = up.call("get", "/openapi.json", token=False)
        assert status == 200, status
        spec = json.loads(raw)
        validate(spec)  # OpenAPI 3.1, by openapi-spec-validator
        assert spec["openapi"].startswith("3.1"), spec["openapi"]

        def running():
            s, _, b = up.call("get", "/v1/apps/echo/units")
            units = [u for u in json.loads(b) if u["state"] == "running"] if s == 200 else []
            return units if len(units) == 2 else None
        unit = wait_until("2 running units", running)[0]
        node = next(m for m in unit["members"] if m["member"] == "head")["node_id"]
        _, _, spec_toml = up.call("get", "/v1/apps/echo/spec")
        spec_toml = spec_toml.decode()
        policy = open(os.path.join(ROOT, "examples", "policies", sorted(os.listdir(os.path.join(ROOT, "examples", "policies")))[0])).read()

        values = {"app": "echo", "unit": unit["unit_id"], "member": "head", "node": node, "pool": "default",
                  "version": "1", "name": "conformance", "node_type": "small", "action": "cordon"}
        # An artifact in the origin (its reads come before the writes), and an agent's
        # tracker token for it: HMAC(HMAC(join token, "flotilla-artifacts-v1"), "tracker\0" + node).
        blob = b"conformance artifact\n"
        status, _, raw = up.call("put", "/v1/artifacts", blob)
        assert status == 201, (status, raw)
        artifact = "sha256:" + json.loads(raw)["sha256"]
        join = open(os.path.join(up.data, "join-token")).read().split()[0]
        key = hmac.new(join.encode(), b"flotilla-artifacts-v1", hashlib.sha256).digest()
        tracker_token = hmac.new(key, b"tracker\0conformance", hashlib.sha256).hexdigest()
        # Before the calls: a pool that reported (so its rows are real, not 404s), and a
        # second version of the app (so a rollback to version 1 has something to undo).
        assert up.call("post", "/v1/pools/default/report", {"instances": []})[0] == 200
        changed = spec_toml.replace('memory = "64Mi"', 'memory = "72Mi"', 1)
        assert up.call("put", "/v1/apps/echo/spec", changed)[0] == 200
        # What each write is sent (a valid request where one is easy to make; else one the
        # document says is refused, so its error answer is checked too).
        bodies = {
            ("put", "/v1/apps/{app}/scale"): {"units": 2},
            ("put", "/v1/apps/{app}/spec"): spec_toml,
            ("post", "/v1/apps/{app}/plan"): changed,
            ("post", "/v1/apps/{app}/rollback"): {"to": 1},
            ("put", "/v1/apps/{app}/demand"): {"requests": [{"resources": {"cpu_millis": 100}, "count": 1}], "ttl_seconds": 60},
            ("put", "/v1/policies/{name}"): policy,
            ("post", "/v1/tokens"): {"name": "conformance", "scopes": ["read"]},
            ("post", "/v1/schedulers"): {"app": "elsewhere", "url": "http://127.0.0.1:1"},
            ("put", "/v1/pools/{pool}/constraints"): {"resource_requests": [{"resources": {"cpu_millis": 100}, "count": 1}]},
            ("put", "/v1/pools/{pool}/node_types/{node_type}"): {"min": 0, "max": 2},
            ("post", "/v1/pools/{pool}/report"): {"instances": []},
            ("put", "/v1/artifacts"): blob,
            ("post", "/v1/apps/{app}/warm"): {},
            ("post", "/v1/artifacts/{name}/announce"): {"node": "conformance", "pieces": 1, "have": "00", "want_origin": 1},
        }
        # Calls that carry a token other than the API's.
        tokens = {("post", "/v1/artifacts/{name}/announce"): tracker_token}
        created = {("put", "/v1/artifacts"): 201}
        # Every call succeeds but these, which are refused as documented (echo uses no
        # artifacts: there is nothing to warm; it has no canary).
        refused = {("post", "/v1/schedulers"): 422, ("post", "/v1/apps/{app}/warm"): 422,
                   # echo rolls without a canary: nothing to promote or abort.
                   ("post", "/v1/apps/{app}/rollout/promote"): 409, ("post", "/v1/apps/{app}/rollout/abort"): 409}
        # Writes after reads, and the token deleted after it is made.
        order = {"get": 0, "put": 1, "post": 1, "delete": 2}
        ops = sorted(((m, t) for t, item in spec["paths"].items() for m in item), key=lambda x: (order.get(x[0], 3), x[1]))
        called = 0
        for method, template in ops:
            path = template
            # A policy's path names the policy its file names.
            if template == "/v1/policies/{name}":
                path = path.replace("{name}", re.search(r'name = "([^"]+)"', policy).group(1))
            if template.startswith("/v1/artifacts/"):
                path = path.replace("{name}", artifact)
            for k, v in values.items():
                path = path.replace("{" + k + "}", v)
            assert "{" not in path, f"no value for a parameter of {template}"
            if template == "/v1/events":
                status, ctype = first_bytes(up.url, path, up.token)
                check(spec, method, template, status, ctype, b"", expect=200)
                called += 1
                continue
            body = bodies.get((method, template))
            expect = refused.get((method, template), created.get((method, template), 204 if template == "/v1/schedulers" else 200))
            status, ctype, raw = up.call(method, path, body, token=tokens.get((method, template), True))
            check(spec, method, template, status, ctype, raw, expect=expect)
            # Refusals too: without a token, a call that needs one is a 401 as documented.
            if spec["paths"][template][method].get("security"):
                s2, c2, r2 = up.call(method, path, body, token=False)
                check(spec, method, template, s2, c2, r2, expect=401)
            called += 1
            if template == "/v1/nodes/{node}/{action}":
                up.call("post", path.replace("/cordon", "/uncordon"))
        # Unknown names answer the documented 404, with an error body.
        for path in ["/v1/apps/nope", "/v1/nodes/nope", "/v1/apps/echo/units/nope/members/head/logs"]:
            template = {"/v1/apps/nope": "/v1/apps/{app}", "/v1/nodes/nope": "/v1/nodes/{node}"}.get(
                path, "/v1/apps/{app}/units/{unit}/members/{member}/logs")
            status, ctype, raw = up.call("get", path)
            assert status == 404, (path, status)
            check(spec, "get", template, status, ctype, raw)
        print(json.dumps({"operations": called, "paths": len(spec["paths"])}))
    finally:
        up.stop()


if __name__ == "__main__":
    sys.exit(main())
