"""Screenshot a real trace of ours in TensorBoard's trace viewer, offline, with headless Chromium.

Not part of CI or the project's dependencies: it needs, in a throwaway virtual environment,
``pip install tensorboard torch-tb-profiler websocket-client`` (made with TensorBoard 2.21.0 and the PyTorch
Profiler plugin torch-tb-profiler 0.4.3), ``apt-get install chromium`` (Chromium 156), and the Web Components
v0 polyfill that plugin's trace page loads from a CDN: ``npm pack webcomponents.js@0.7.24`` and pass its
``package/webcomponents.min.js`` as ``--polyfill``.

What it does: copies the trace into a fresh log directory as ``RUN/hpu0.pt.trace.json`` (the layout the plugin
reads: a run is a folder holding ``WORKER.pt.trace.json[.gz]``), starts TensorBoard on loopback, opens the
plugin's own trace page (``trace_embedding.html``: the Chrome trace viewer the plugin's "Trace" view embeds)
in headless Chromium over the DevTools protocol, hands it the trace as the plugin serves it (``/trace``), zooms
to a window of steps, selects a span in it (by default the first MME kernel, so that the panel below shows its
args: recipe, recipe id and ``"estimate": true``) and saves a PNG. The browser is offline: every request
leaving loopback fails, except the polyfill, answered from the local file. The plugin's own page is not used:
it draws nothing until Google's chart loader has loaded, which needs the network; its trace frame is hosted in a
page of the same shape instead (an iframe that is posted the trace, as the plugin's Trace view does).

It prints the rows the viewer built for each process, with their span counts, so a row lost on loading shows.

    /tmp/tbvenv/bin/python bench/trace_screenshot.py TRACE.json OUT.png --polyfill webcomponents.min.js \\
        --tensorboard /tmp/tbvenv/bin/tensorboard --steps 30:33
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import websocket  # websocket-client, from the throwaway environment

PLUGIN = "data/plugin/pytorch_profiler"
WORKER = "hpu0"


class ShotError(RuntimeError):
    """A step of the screenshot that did not happen: one line saying which."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, probe, timeout_s: float):
    """Poll ``probe`` until it returns a true value (ShotError after ``timeout_s``)."""
    end, last = time.time() + timeout_s, ""
    while time.time() < end:
        try:
            value = probe()
            if value:
                return value
        except (OSError, ShotError) as e:  # not up yet: the server, or the page's script
            last = f" (last: {e})"
        time.sleep(0.5)
    raise ShotError(f"timed out waiting for {what}{last}")


def start_tensorboard(exe: str, trace: str, run: str, folder: str) -> tuple[subprocess.Popen, str]:
    os.makedirs(os.path.join(folder, "logs", run))
    shutil.copy(trace, os.path.join(folder, "logs", run, f"{WORKER}.pt.trace.json"))
    port = free_port()
    log = open(os.path.join(folder, "tensorboard.log"), "w")
    proc = subprocess.Popen([exe, "--logdir", os.path.join(folder, "logs"), "--host", "127.0.0.1",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/{PLUGIN}/"

    def loaded():  # the plugin lists a run once it has parsed it
        body = json.load(urllib.request.urlopen(base + "runs", timeout=5))
        return run in body.get("runs", []) and not body.get("loading")

    try:
        wait_for("TensorBoard to load the trace", loaded, 120)
    except ShotError:
        stop(proc)
        raise
    return proc, base


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def _exception(result: dict) -> str:
    details = result["exceptionDetails"]
    return details.get("exception", {}).get("description", details["text"]).splitlines()[0]


class Browser:
    """Headless Chromium driven over the DevTools protocol; requests off loopback fail, but the polyfill."""

    def __init__(self, exe: str, folder: str, polyfill: bytes, size: tuple[int, int]):
        port = free_port()
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", f"--remote-debugging-port={port}",
             f"--user-data-dir={os.path.join(folder, 'chromium')}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            tabs = wait_for("Chromium's DevTools endpoint",
                            lambda: json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=5)), 60)
            page = next(t for t in tabs if t["type"] == "page")
            self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True)
            self.ids, self.polyfill = itertools.count(1), polyfill
            self.call("Fetch.enable", patterns=[{"urlPattern": "*"}])
            self.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                      mobile=False)
        except (ShotError, OSError, StopIteration) as e:
            stop(self.proc)
            raise ShotError(f"Chromium's DevTools endpoint: {e or 'no page'}") from None

    def close(self) -> None:
        self.ws.close()
        stop(self.proc)

    def send(self, method: str, **params) -> int:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        return i

    def call(self, method: str, wait_s: float = 60, **params) -> dict:
        """Send one command and answer the page's requests until its reply (or ``wait_s`` of quiet)."""
        want = self.send(method, **params)
        self.ws.settimeout(wait_s)
        while True:
            try:
                msg = json.loads(self.ws.recv())
            except websocket.WebSocketTimeoutException:
                raise ShotError(f"no answer to {method} in {wait_s} s") from None
            if msg.get("id") == want:
                if "error" in msg or "exceptionDetails" in msg.get("result", {}):
                    raise ShotError(f"{method}: {msg.get('error') or _exception(msg['result'])}")
                return msg.get("result", {})
            if msg.get("method") == "Fetch.requestPaused":
                self._answer(msg["params"])

    def _answer(self, req: dict) -> None:
        url, rid = req["request"]["url"], req["requestId"]
        if url.startswith("http://127.0.0.1:") and url.endswith("/" + HOST_PAGE):
            self._fulfill(rid, "text/html", HOST_HTML)
        elif url.startswith("http://127.0.0.1:"):
            self.send("Fetch.continueRequest", requestId=rid)
        elif url.endswith("/webcomponents.min.js"):
            self._fulfill(rid, "application/javascript", self.polyfill)
        else:
            print(f"offline: refused {url}", file=sys.stderr)
            self.send("Fetch.failRequest", requestId=rid, errorReason="InternetDisconnected")

    def _fulfill(self, rid: str, kind: str, body: bytes) -> None:
        self.send("Fetch.fulfillRequest", requestId=rid, responseCode=200,
                  responseHeaders=[{"name": "Content-Type", "value": kind}], body=base64.b64encode(body).decode())

    def run(self, expression: str):
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return out.get("result", {}).get("value")

    def settle(self, seconds: float) -> None:
        """Let the page work for ``seconds`` while its requests are still answered."""
        self.run(f"new Promise(r => setTimeout(r, {int(seconds * 1000)}))")


# The plugin's Trace view holds its trace page in an iframe and posts it the trace once the page says "ready";
# this page, served to the browser alone (it never reaches TensorBoard), does the same.
HOST_PAGE = "trace_screenshot_host.html"
HOST_HTML = (b'<!doctype html><html><body style="margin:0"><iframe src="trace_embedding.html" '
             b'style="display:block;border:0;width:100vw;height:100vh"></iframe></body></html>')
VIEWER = "frames[0].document.querySelector('tr-ui-timeline-view')"
LOAD = """(async () => {
  const text = await (await fetch(%(url)s)).text();
  frames[0].postMessage({msg: 'data', name: %(name)s, data: text}, '*');
  return text.length;
})()"""
ROWS = """(() => {
  const m = %(viewer)s.model;
  if (!m) return null;
  return Object.values(m.processes).map(p => p.name + ': ' + Object.values(p.threads)
    .sort((a, b) => a.tid - b.tid).map(t => t.name + ' ' + t.sliceGroup.length).join(', '));
})()"""
ZOOM = """(() => {
  const tr = frames[0].tr, v = %(viewer)s;
  const steps = v.model.getAllThreads().find(t => t.name === 'Steps').sliceGroup.slices;
  const n = s => (s.args && typeof s.args.step === 'number') ? s.args.step : NaN;
  const pick = steps.filter(s => n(s) >= %(first)d && n(s) <= %(last)d);
  if (!pick.length) return 0;
  const begin = pick[0].start, end = pick[pick.length - 1].end, pad = (end - begin) * 0.02;
  const vp = v.trackView.viewport, dt = new tr.ui.TimelineDisplayTransform();
  dt.set(vp.currentDisplayTransform);
  dt.xSetWorldBounds(begin - pad, end + pad, vp.modelTrackContainer.canvas.width);
  vp.setDisplayTransformImmediately(dt);
  const row = v.model.getAllThreads().find(t => t.name === %(select)s);
  const chosen = row && row.sliceGroup.slices.find(s => s.start >= begin && s.start <= end) || pick[0];
  v.brushingStateController.changeSelectionFromTimeline(new tr.model.EventSet(chosen));
  return pick.length;
})()"""


def screenshot(ns: argparse.Namespace, folder: str) -> list[str]:
    tb, base = start_tensorboard(ns.tensorboard, ns.trace, ns.run, folder)
    browser = None
    try:
        with open(ns.polyfill, "rb") as f:
            browser = Browser(ns.chromium, folder, f.read(), ns.size)
        browser.call("Page.navigate", url=base + HOST_PAGE)
        wait_for("the trace viewer", lambda: browser.run(f"!!frames[0].tr && !!{VIEWER}"), 60)
        url = f"{base}trace?run={ns.run}&worker={WORKER}&span=default"
        browser.run(LOAD % {"url": json.dumps(url), "name": json.dumps(ns.run)})
        rows = wait_for("the trace to load", lambda: browser.run(ROWS % {"viewer": VIEWER}), 60)
        if ns.steps:
            first, last = (int(x) for x in ns.steps.split(":"))
            browser.settle(1)  # the viewer sets its first viewport on its first frame: zoom after it
            if not browser.run(ZOOM % {"viewer": VIEWER, "first": first, "last": last,
                                       "select": json.dumps(ns.select)}):
                raise ShotError(f"no steps {ns.steps} on the Steps row")
        browser.settle(2)
        shot = browser.call("Page.captureScreenshot", format="png")
        with open(ns.out, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        return rows
    finally:
        if browser:
            browser.close()
        stop(tb)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="a trace of ours (hpurecipe run/analyze --trace)")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("--polyfill", required=True, help="webcomponents.min.js of webcomponents.js 0.7.24 (npm)")
    p.add_argument("--tensorboard", default="tensorboard", help="the tensorboard executable to start")
    p.add_argument("--chromium", default="chromium")
    p.add_argument("--run", default="hpu_trace", help="the run's name in TensorBoard (the viewer's title)")
    p.add_argument("--steps", default="",
                   help="zoom to steps A:B of the host's Steps row (their args' step; default: all)")
    p.add_argument("--select", default="MME", help="select the window's first span of this row (its args "
                   "show below; default MME, a kernel), else the first step")
    p.add_argument("--size", default="1400,900", type=lambda s: tuple(int(x) for x in s.split(",")))
    ns = p.parse_args()
    folder = tempfile.mkdtemp(prefix="trace_screenshot_")
    try:
        rows = screenshot(ns, folder)
    except (ShotError, OSError) as e:
        sys.exit(f"trace_screenshot: {e}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("\n".join(rows))
    print(f"{ns.out}: {os.path.getsize(ns.out) / 1024:.0f} KB")


if __name__ == "__main__":
    main()
