"""The dashboard in real headless Chromium, driven by Playwright for Python.

Starts a real `flotilla up --agents 4 --app examples/echo.toml` (and, for the pools page,
a second `up --autoscale`), opens the page and checks, without ever reloading it:

- the page lists the agents;
- an app whose standalone scheduler does not answer is listed as unreachable;
- scaling the app from the page changes the units shown;
- `kill -9` of an agent turns that node dead on the page within 5 s;
- a wrong token is refused with the server's message and nothing changes;
- the app page's history chart has samples and zooms to 24 h; it lists its events (the scale, with the token's name), the node page what
  ran there;
- a spec with an error shows the error and the app keeps its old spec;
- a good spec is listed as a new version with its diff, and a roll back to version 1
  from the list makes a third version that rolls the old spec out;
- a token with the operate scope sees scale and roll back but not apply, and a token for
  another app sees neither;
- a canary applied from the editor shows its step, share and why it waits, is promoted
  from the page, and a second one is aborted from the page (the spec goes back);
- a member's live tail shows a line it writes after the tail opened, and its stderr;
- a drain from the page moves the units off the node;
- a node under a preemption notice shows `preempting`;
- the pools page shows a pool's instances and its history chart, and after a control-plane restart on the same
  address the page reconnects by itself; a stream of another build of the page makes it reload itself.

A screenshot of each page goes to --out. Every process started is ended by its process
group, pass or fail. Playwright's own browser download is never used: Chromium is
Debian's (/usr/bin/chromium, or $FLOTILLA_CHROMIUM).

    python3 tests/browser/dashboard.py --flotilla target/debug/flotilla --out target/browser
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


class Up:
    """`flotilla up` in its own process group, with a fresh data dir."""

    def __init__(self, flotilla, name, args, listen="127.0.0.1:0", data=None):
        self.data = data or tempfile.mkdtemp(prefix=f"flotilla-browser-{name}-")
        env = dict(os.environ)
        # Members run `flotilla echo-server`: the binary under test must be on PATH.
        env["PATH"] = os.path.dirname(os.path.abspath(flotilla)) + os.pathsep + env.get("PATH", "")
        self.log = open(os.path.join(self.data, "up.log"), "a")
        addr_file = os.path.join(self.data, "control.addr")
        if os.path.exists(addr_file):
            os.remove(addr_file)
        self.proc = subprocess.Popen(
            [flotilla, "up", "--listen", listen, "--data", self.data, *args],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 30
        while not os.path.exists(addr_file):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"flotilla up did not start; see {self.data}/up.log")
            time.sleep(0.1)
        self.url = open(addr_file).read().strip()
        self.token = open(os.path.join(self.data, "api-token")).read().strip()

    def get(self, path):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            body = r.read().decode()
            return json.loads(body) if r.headers.get_content_type() == "application/json" else body

    def agent_pids(self):
        pids = []
        for d in (os.path.join(self.data, "agents"), os.path.join(self.data, "pool", "default")):
            if os.path.isdir(d):
                for f in os.listdir(d):
                    if f.endswith(".pid"):
                        try:
                            pids.append(int(open(os.path.join(d, f)).read().strip()))
                        except (OSError, ValueError):
                            pass
        return pids

    def stop(self):
        for pid in self.agent_pids():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(timeout=10)
        self.log.close()


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answer_then_vanish(listing):
    """A standalone scheduler that answers the control plane's registration check (one
    connection, its `GET /v1/apps` listing as JSON) and then is gone: its app is listed
    unreachable."""
    import socket
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    body = json.dumps(listing).encode()

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}"


def wait_until(what, fn, timeout=30.0, every=0.2):
    deadline = time.time() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def running_units(up, app="echo"):
    return [u for u in up.get(f"/v1/apps/{app}/units") if u["state"] == "running"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flotilla", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    chromium = os.environ.get("FLOTILLA_CHROMIUM", "/usr/bin/chromium")
    results = {}
    ups = []
    try:
        up = Up(a.flotilla, "echo", ["--agents", "4", "--app", os.path.join(ROOT, "examples", "echo.toml")])
        ups.append(up)
        wait_until("two running units", lambda: len(running_units(up)) == 2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            # Refused actions (401, 422) are logged by Chromium as failed loads: expected.
            page.on("console", lambda m: errors.append(m.text)
                    if m.type == "error" and not m.text.startswith("Failed to load resource") else None)

            # Federation: the agents are there, live.
            t0 = time.time()
            page.goto(up.url + "/#/federation")
            expect(page.get_by_test_id("conn-status")).to_have_text("live", timeout=15000)
            expect(page.get_by_test_id("node-count")).to_have_text("4", timeout=15000)
            results["first_paint_s"] = round(time.time() - t0, 3)
            expect(page.get_by_test_id("domain-card")).to_have_count(2)
            page.screenshot(path=os.path.join(a.out, "federation.png"), full_page=True)

            # Nodes: one row per agent.
            page.click("[data-testid=nav-nodes]")
            expect(page.locator("[data-testid=node-row]")).to_have_count(4, timeout=10000)
            page.screenshot(path=os.path.join(a.out, "nodes.png"), full_page=True)

            # A standalone scheduler that does not answer: its app is listed as unreachable
            # (with the error as the pill's title), and echo is listed as before.
            ghost = answer_then_vanish([{"app": "ghost", "scheduler": {"instance": "a"}}])
            req = urllib.request.Request(
                up.url + "/v1/schedulers", method="POST",
                data=json.dumps({"app": "ghost", "url": ghost}).encode(),
                headers={"Authorization": f"bearer {up.token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.status == 204, r.status
            page.click("[data-testid=nav-apps]")
            ghost_row = page.locator("[data-testid=app-row][data-app=ghost]")
            expect(ghost_row).to_contain_text("unreachable", timeout=15000)
            expect(page.locator("[data-testid=app-row][data-app=echo]")).to_have_count(1)
            page.screenshot(path=os.path.join(a.out, "apps-unreachable.png"), full_page=True)

            # A wrong token is refused with the server's message; nothing changes.
            page.goto(up.url + "/#/apps/echo")
            expect(page.locator("[data-testid=unit-row]")).to_have_count(2, timeout=10000)
            page.get_by_test_id("scale-input").fill("3")
            page.get_by_test_id("scale-button").click()
            page.get_by_test_id("token-input").fill("not-the-token")
            page.get_by_test_id("token-save").click()
            toast = page.get_by_test_id("toast")
            expect(toast).to_have_attribute("data-kind", "error", timeout=10000)
            expect(toast).to_contain_text("bearer token is wrong")
            time.sleep(1.5)
            assert up.get("/v1/apps/echo")["desired_units"] == 2, "a refused scale changed the app"
            expect(page.locator("[data-testid=unit-row]")).to_have_count(2)

            # With the right token, scaling from the page changes the units shown.
            page.evaluate("t => sessionStorage.setItem('flotilla.api-token', t)", up.token)
            page.get_by_test_id("scale-input").fill("3")
            page.get_by_test_id("scale-button").click()
            expect(page.locator("[data-testid=unit-row][data-state=running]")).to_have_count(3, timeout=30000)
            assert up.get("/v1/apps/echo")["desired_units"] == 3
            # The history chart has samples (every 10 s) and zooms out to 24 h.
            hist = page.get_by_test_id("history-chart")
            expect(hist).to_have_attribute("data-points", re.compile(r"^[1-9]"), timeout=25000)
            page.locator("button[data-window='24h']").click()
            expect(hist).to_have_attribute("data-window", "24h")
            expect(page.locator("button[data-window='24h']")).to_have_attribute("aria-pressed", "true")
            # The app page lists what happened to it, the scale with the token's name.
            expect(page.locator("[data-testid=event-row][data-type=scale]").first).to_contain_text(
                "scaled to 3 units", timeout=10000)
            page.screenshot(path=os.path.join(a.out, "app.png"), full_page=True)

            # A spec with an error: the error is shown, the app keeps its spec.
            before = up.get("/v1/apps/echo/spec")
            editor = page.get_by_test_id("spec-editor")
            expect(editor).to_have_value(before, timeout=10000)
            editor.fill(before.replace('cpu = "250m"', 'cpu = "-1"', 1))
            page.get_by_test_id("apply-button").click()
            expect(page.get_by_test_id("spec-error").first).to_contain_text("cpu", timeout=10000)
            assert up.get("/v1/apps/echo/spec") == before, "a bad spec was applied"
            page.screenshot(path=os.path.join(a.out, "app-spec-error.png"), full_page=True)

            # A good spec from the editor is version 2, listed with its diff; rolling back
            # to version 1 from the list makes version 3, the old spec again.
            editor.fill(before.replace('memory = "64Mi"', 'memory = "72Mi"', 1))
            page.get_by_test_id("apply-button").click()
            row2 = page.locator("[data-testid=versions] tr[data-version='2']")
            expect(row2).to_contain_text("in force", timeout=10000)
            expect(row2).to_contain_text("api-token")
            page.get_by_test_id("diff-toggle-2").click()
            expect(page.get_by_test_id("diff-2")).to_contain_text('unit.head.memory: "64Mi" → "72Mi"')
            page.screenshot(path=os.path.join(a.out, "app-versions.png"), full_page=True)
            page.once("dialog", lambda d: d.accept())
            page.get_by_test_id("rollback-to-1").click()
            row3 = page.locator("[data-testid=versions] tr[data-version='3']")
            expect(row3).to_contain_text("rollback of 1", timeout=10000)
            expect(row3).to_contain_text("in force")
            expect(editor).to_have_value(before, timeout=10000)
            template = up.get("/v1/apps/echo")["spec"]["template"]
            wait_until("the rollback rolled out", lambda: len(
                [u for u in running_units(up) if u["template"] == template]) == 3, timeout=120)

            # A scoped token sees only what it may do: operate scales and rolls back but
            # does not apply; a token for another app changes nothing here.
            def make_token(name, scopes, apps=None):
                req = urllib.request.Request(
                    up.url + "/v1/tokens", method="POST",
                    data=json.dumps({"name": name, "scopes": scopes, "apps": apps}).encode(),
                    headers={"Authorization": f"Bearer {up.token}", "Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=10) as r:
                    return json.loads(r.read())["token"]

            def use_token(t):
                page.get_by_role("button", name="API token").click()
                page.get_by_test_id("token-input").fill(t)
                page.get_by_test_id("token-save").click()

            use_token(make_token("ops", ["operate"]))
            expect(page.get_by_test_id("apply-button")).to_be_hidden(timeout=10000)
            expect(page.get_by_test_id("scale-button")).to_be_visible()
            expect(page.get_by_test_id("rollback-to-2")).to_be_visible()
            page.screenshot(path=os.path.join(a.out, "app-operate-token.png"), full_page=True)
            use_token(make_token("other-ci", ["deploy", "operate"], ["not-echo"]))
            expect(page.get_by_test_id("scale-button")).to_be_hidden(timeout=10000)
            expect(page.get_by_test_id("apply-button")).to_be_hidden()
            use_token(up.token)
            expect(page.get_by_test_id("apply-button")).to_be_visible(timeout=10000)

            # A canary from the editor: the rollout section shows its step, its share and
            # why it waits (no traffic reaches it here), and is promoted from the page; a
            # second one is aborted from the page and the spec goes back.
            canary = ('[rollout]\nstrategy = "canary"\nsteps = ["50%"]\nstep_interval = "1s"\nauto_promote = false\n')
            spec = up.get("/v1/apps/echo/spec").replace("[rollout]\n", canary, 1)
            editor.fill(spec.replace('memory = "64Mi"', 'memory = "80Mi"', 1) + "\n[rollout.analysis]\nmin_requests = 1000000\n")
            page.get_by_test_id("apply-button").click()
            expect(page.get_by_test_id("rollout-step")).to_contain_text("step 1 of 1", timeout=30000)
            expect(page.get_by_test_id("rollout-share")).to_contain_text("50 % of requests", timeout=60000)
            expect(page.get_by_test_id("rollout-waiting")).to_contain_text("min_requests: 0 of 1000000", timeout=30000)
            expect(page.get_by_test_id("rollout-new")).to_be_visible()
            expect(page.get_by_test_id("rollout-chart")).to_be_visible()
            page.screenshot(path=os.path.join(a.out, "app-canary.png"), full_page=True)
            page.get_by_test_id("promote-button").click()
            wait_until("the promoted canary completes",
                       lambda: up.get("/v1/apps/echo")["rollout"]["state"] == "complete", timeout=120)
            expect(page.get_by_test_id("promote-button")).to_be_hidden(timeout=10000)
            expect(page.get_by_test_id("rollout-info")).to_contain_text("canary, promoted")
            editor.fill(up.get("/v1/apps/echo/spec").replace('memory = "80Mi"', 'memory = "88Mi"', 1))
            page.get_by_test_id("apply-button").click()
            expect(page.get_by_test_id("abort-button")).to_be_visible(timeout=30000)
            page.once("dialog", lambda d: d.accept())
            page.get_by_test_id("abort-button").click()
            wait_until("the aborted canary's spec reverted",
                       lambda: up.get("/v1/apps/echo")["spec"]["source"] == "revert", timeout=30)
            expect(page.get_by_test_id("abort-button")).to_be_hidden(timeout=10000)
            wait_until("three units of the promoted version run", lambda: len(running_units(up)) == 3, timeout=60)

            # A member's live tail: its last lines, then each line it writes next.
            unit = running_units(up)[0]
            head = next(m for m in unit["members"] if m["member"] == "head")
            page.locator(f"[data-testid=member-logs][data-member='{unit['unit_id']}/head']").click()
            expect(page.get_by_test_id("log-state")).to_have_text("following", timeout=10000)
            tail = page.get_by_test_id("log-tail")

            def asked_and_shown():
                urllib.request.urlopen(f"http://{head['address']}/from-the-browser", timeout=5).read()
                return "GET /from-the-browser 200" in tail.inner_text()
            wait_until("a new line in the live tail", asked_and_shown, timeout=20)
            page.get_by_role("button", name="stderr").click()
            expect(page.get_by_test_id("log-tail")).to_contain_text("echo-server listening", timeout=10000)
            page.screenshot(path=os.path.join(a.out, "app-logs.png"), full_page=True)

            # kill -9 of an agent: that node is dead on the page within 5 s, no reload.
            victim = "node-4"
            os.killpg(int(open(os.path.join(up.data, "agents", "node-4.pid")).read()), signal.SIGKILL)
            killed = time.time()
            page.goto(up.url + "/#/nodes")  # a hash change, not a reload
            expect(page.locator(f"[data-testid=node-row][data-node={victim}]")).to_have_attribute(
                "data-status", "dead", timeout=5000)
            results["dead_on_page_s"] = round(time.time() - killed, 3)

            # A drain from the page moves the units off the node.
            units = up.get("/v1/apps/echo/units")
            busy = next(m["node_id"] for u in units if u["state"] == "running" for m in u["members"]
                        if m["node_id"] and m["node_id"] != victim)
            page.goto(up.url + f"/#/nodes/{busy}")
            expect(page.get_by_test_id("node-status")).to_have_text("alive", timeout=10000)
            expect(page.locator("[data-testid=event-row][data-type=unit]").first).to_contain_text(
                "echo-", timeout=10000)
            page.screenshot(path=os.path.join(a.out, "node.png"), full_page=True)
            page.get_by_test_id("drain-button").click()

            def moved():
                us = running_units(up)
                on = [m for u in us for m in u["members"] if m["node_id"] == busy]
                return len(us) == 3 and not on
            wait_until("the drained node's units to move", moved, timeout=60)

            # A cloud's preemption notice on a live node: the nodes list and the node's
            # page say `preempting` while it is still alive.
            noticed = next(n for n in ("node-1", "node-2", "node-3") if n != busy)
            open(os.path.join(up.data, "agents", noticed, "preemption-notice"), "w").close()
            page.goto(up.url + "/#/nodes")
            row = page.locator(f"[data-testid=node-row][data-node={noticed}]")
            expect(row).to_contain_text("preempting", timeout=15000)
            expect(row).to_have_attribute("data-status", "alive")
            page.goto(up.url + f"/#/nodes/{noticed}")
            expect(page.get_by_test_id("node-preempting")).to_be_visible(timeout=10000)
            assert not errors, f"errors in the page: {errors}"
            browser.close()
        up.stop()
        ups.remove(up)

        # Pools: a pool autoscaler's instances by type and state.
        listen = f"127.0.0.1:{free_port()}"
        pool_args = ["--autoscale", "--pool", os.path.join(ROOT, "examples", "pool.toml"),
                     "--app", os.path.join(ROOT, "examples", "echo.toml")]
        pool_up = Up(a.flotilla, "pool", pool_args, listen=listen)
        ups.append(pool_up)

        def pool_running(u):
            return lambda: any(i["state"] == "running" for p in u.get("/v1/pools") for i in p.get("instances", []))
        wait_until("the pool reporting running instances", pool_running(pool_up), timeout=60)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(pool_up.url + "/#/pools")
            expect(page.get_by_test_id("pool-card")).to_have_count(1, timeout=15000)
            expect(page.locator("[data-testid=instance-row][data-state=running]").first).to_be_visible(timeout=15000)
            # The pool's history chart gets its samples (every 10 s).
            expect(page.locator("[data-testid=pool-card] [data-testid=history-chart]")).to_have_attribute(
                "data-points", re.compile(r"^[1-9]"), timeout=25000)
            page.screenshot(path=os.path.join(a.out, "pools.png"), full_page=True)

            # The control plane restarts (same address, same data dir): the page says so,
            # reconnects by itself and shows the new cluster, without a reload.
            page.evaluate("window.__sameTab = true")
            data = pool_up.data
            pool_up.stop()
            ups.remove(pool_up)
            expect(page.get_by_test_id("conn-status")).to_have_text("reconnecting", timeout=20000)
            pool_up = Up(a.flotilla, "pool", pool_args, listen=listen, data=data)
            ups.append(pool_up)
            expect(page.get_by_test_id("conn-status")).to_have_text("live", timeout=30000)
            expect(page.locator("[data-testid=instance-row][data-state=running]").first).to_be_visible(timeout=60000)
            assert page.evaluate("window.__sameTab === true"), "the page reloaded across a restart of its own build"

            # Behind the stream now is another build of the page (an upgrade): when the
            # stream reconnects, the page loads itself again.
            other = ('event: snapshot_begin\ndata: {"nodes_total":0,"ui":"another-build"}\n\n'
                     'event: snapshot_end\ndata: {}\n\n')
            page.route("**/v1/events", lambda route: route.fulfill(
                status=200, headers={"content-type": "text/event-stream"}, body=other))
            with page.expect_event("load", timeout=30000):
                pool_up.stop()
                ups.remove(pool_up)
            assert page.evaluate("window.__sameTab === undefined"), "a page of another build stays"
            results["reloads_for_another_build"] = True
            browser.close()
    finally:
        for u in ups:
            u.stop()
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
