"""The dashboard's speed in real headless Chromium (Playwright for Python), for
`flotilla-loadtest dashboard`, which starts the shards, the simulated nodes and the
control plane, then runs this against it:

    python3 loadtest/dashboard_perf.py --url http://127.0.0.1:PORT --nodes 100000 --seconds 20

It opens #/federation and measures, from the page's timing hook (window.__flotilla, see
crates/control/ui/js/store.js; performance.now() milliseconds from navigation start):

- first meaningful paint: navigation start to the node count shown and the heatmap drawn
  with every node: the later of the end of the first frame drawn after the snapshot and
  the heatmap's first layout whose domain labels add up to every node (a
  MutationObserver; before 2026-12-06 a resize during the snapshot could lay the
  heatmap out half-full and put the full layout off by up to a second, which the first
  frame alone did not show). Split into the page's modules
  loaded (they take the stream over), the snapshot's arrival (boot.js opened the stream
  before the modules; what comes early waits for them), its parsing and applying, and
  that render;
- live updates: for each message after that, its listener running to the end of the
  animation-frame render that applied it (p50 / p99 / max); each render's duration
  and the interval between animation frames while the stream runs;
- memory: the JS heap (CDP Performance.getMetrics JSHeapUsedSize, and after a forced
  GC), and the Chromium processes' RSS and PSS.

Writes the figures as JSON to --out (when given) and prints them as one compact JSON
line last. Chromium is Debian's (--chromium, default /usr/bin/chromium): Playwright's own
download is never used. The browser is closed in every case; its caller also kills
what is left by process group.
"""

import argparse
import json
import os
import re
import sys
import time

from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


# The page's console line once it is painted (see the init script in main).
PAINTED = "flotilla-dashboard-perf: painted"


def pct(xs, q):
    """Nearest-rank percentile of xs (0 when empty)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


def r1(x):
    return round(float(x), 1)


def descendants(root):
    """pid → comm of every process under root (from /proc)."""
    parent, comm = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        head, _, rest = stat.rpartition(")")
        comm[int(d)] = head.partition("(")[2]
        parent[int(d)] = int(rest.split()[1])
    out, frontier = {}, [root]
    while frontier:
        p = frontier.pop()
        for c, pp in parent.items():
            if pp == p and c not in out:
                out[c] = comm[c]
                frontier.append(c)
    return out


def chromium_memory():
    """Sum of RSS and PSS (MiB) over the Chromium processes under this one."""
    rss = pss = 0
    n = 0
    for pid, comm in descendants(os.getpid()).items():
        if "chrom" not in comm.lower():
            continue
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    rss += int(line.split()[1])
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
            n += 1
        except OSError:
            pass
    return {"chromium_processes": n, "chromium_rss_mb": r1(rss / 1024), "chromium_pss_mb": r1(pss / 1024)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="the control plane, http://HOST:PORT")
    ap.add_argument("--nodes", type=int, required=True, help="nodes the page must show")
    ap.add_argument("--seconds", type=int, default=20, help="how long to watch the live stream")
    ap.add_argument("--chromium", default=os.environ.get("FLOTILLA_CHROMIUM", "/usr/bin/chromium"))
    ap.add_argument("--out", help="also write the figures here (JSON)")
    ap.add_argument("--width", type=int, default=1440)
    ap.add_argument("--height", type=int, default=900)
    a = ap.parse_args()

    os.environ["PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD"] = "1"
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=a.chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            ctx = browser.new_context(viewport={"width": a.width, "height": a.height})
            page = ctx.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            cdp = ctx.new_cdp_session(page)
            cdp.send("Performance.enable")

            def heap_mb():
                m = {x["name"]: x["value"] for x in cdp.send("Performance.getMetrics")["metrics"]}
                return m.get("JSHeapUsedSize", 0) / 2**20, m.get("JSHeapTotalSize", 0) / 2**20

            # When the heatmap is first laid out with every node: its domain labels ("NAME
            # 20,000 nodes") add up to them. The page's own hook marks the first frame after
            # the snapshot, which is the same moment only if that frame lays the heatmap out.
            page.add_init_script("""(() => {
              window.__heatmapFullAt = null;
              const want = %d;
              new MutationObserver((_, obs) => {
                let n = 0;
                for (const el of document.querySelectorAll('.heatmap-label')) {
                  const m = /([\\d,]+) nodes/.exec(el.textContent);
                  if (m) n += Number(m[1].replace(/,/g, ''));
                }
                if (n >= want) { window.__heatmapFullAt = performance.now(); obs.disconnect(); }
              }).observe(document, { childList: true, subtree: true, characterData: true });
              // Says when the page is painted on the console rather than being asked:
              // Playwright's first evaluation in a page compiles its injected script on
              // the page's main thread (20-40 ms), which polling put before the page's
              // own modules.
              const done = setInterval(() => {
                if (window.__flotilla && window.__flotilla.snapshotDoneAt !== null && window.__heatmapFullAt !== null) {
                  clearInterval(done);
                  console.debug('%s');
                }
              }, 20);
            })()""" % (a.nodes, PAINTED))
            with page.expect_console_message(lambda m: m.text == PAINTED, timeout=180_000):
                page.goto(a.url.rstrip("/") + "/#/federation", wait_until="commit", timeout=60_000)
            first = page.evaluate("""() => {
              const p = window.__flotilla;
              const nav = performance.getEntriesByType('navigation')[0];
              const c = document.querySelector('[data-testid="heatmap"]');
              return {taken: p.takenAt, begin: p.snapshotBeginAt, end: p.snapshotEndAt,
                      done: Math.max(p.snapshotDoneAt, window.__heatmapFullAt), frameDone: p.snapshotDoneAt,
                      heatmapFull: window.__heatmapFullAt,
                      firstRender: p.snapshotRenderMs,
                      renders: p.renders.length, applied: p.applied.length,
                      htmlDone: nav ? nav.responseEnd : null,
                      domContentLoaded: nav ? nav.domContentLoadedEventEnd : null,
                      count: document.querySelector('[data-testid="node-count"]').textContent,
                      canvas: c ? [c.width, c.height] : null};
            }""")
            shown = int(re.sub(r"\D", "", first["count"]) or 0)
            heap_snapshot, _ = heap_mb()
            # The interval between animation frames while the stream runs.
            page.evaluate("""() => {
              window.__frames = [];
              let last = null;
              const f = (t) => { if (last !== null) window.__frames.push(t - last); last = t;
                                 if (window.__frames.length < 200000) requestAnimationFrame(f); };
              requestAnimationFrame(f);
            }""")
            heap_max = heap_snapshot
            t_end = time.time() + a.seconds
            while time.time() < t_end:
                time.sleep(1)
                heap_max = max(heap_max, heap_mb()[0])
            live = page.evaluate("""([a0, r0]) => {
              const p = window.__flotilla;
              return {applied: p.applied.slice(a0), renders: p.renders.slice(r0), frames: window.__frames.slice()};
            }""", [first["applied"], first["renders"]])
            heap_end, heap_total = heap_mb()
            mem = chromium_memory()
            cdp.send("HeapProfiler.enable")
            cdp.send("HeapProfiler.collectGarbage")
            heap_gc, _ = heap_mb()
            final_count = int(re.sub(r"\D", "", page.locator('[data-testid="node-count"]').text_content()) or 0)
        finally:
            browser.close()

    lat = [d - arr for arr, d in live["applied"]]
    out = {
        "nodes": a.nodes,
        "nodes_shown": shown,
        "nodes_shown_at_end": final_count,
        "first_paint_seconds": round(first["done"] / 1000, 3),
        "first_paint_html_ms": r1(first["htmlDone"] or 0),
        "first_paint_modules_ms": r1(first["taken"] or 0),
        "first_paint_snapshot_begin_ms": r1(first["begin"]),
        "first_paint_snapshot_applied_ms": r1(first["end"]),
        "first_paint_render_ms": r1(first["firstRender"]),
        "first_paint_first_frame_ms": r1(first["frameDone"]),
        "first_paint_heatmap_full_ms": r1(first["heatmapFull"]),
        "heatmap_canvas_px": first["canvas"],
        "update_messages": len(lat),
        "update_apply_p50_ms": r1(pct(lat, 0.5)),
        "update_apply_p99_ms": r1(pct(lat, 0.99)),
        "update_apply_max_ms": r1(max(lat) if lat else 0),
        "render_p50_ms": r1(pct(live["renders"], 0.5)),
        "render_p99_ms": r1(pct(live["renders"], 0.99)),
        "render_max_ms": r1(max(live["renders"]) if live["renders"] else 0),
        "frame_interval_p50_ms": r1(pct(live["frames"], 0.5)),
        "frame_interval_p99_ms": r1(pct(live["frames"], 0.99)),
        "frame_interval_max_ms": r1(max(live["frames"]) if live["frames"] else 0),
        "js_heap_mb": r1(heap_end),
        "js_heap_total_mb": r1(heap_total),
        "js_heap_after_snapshot_mb": r1(heap_snapshot),
        "js_heap_max_mb": r1(heap_max),
        "js_heap_after_gc_mb": r1(heap_gc),
        **mem,
        "page_errors": len(errors),
    }
    for e in errors[:5]:
        print("page error:", e, file=sys.stderr)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f)
    print(json.dumps(out, separators=(",", ":")))
    # The caller checks nodes_shown and page_errors; a figure was measured either way.
    return 0


if __name__ == "__main__":
    sys.exit(main())
