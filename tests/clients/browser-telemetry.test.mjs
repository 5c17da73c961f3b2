// Drives examples/browser-telemetry in headless Chromium (Debian's /usr/bin/chromium via
// playwright-core) against a real ursula server, ursula-indexer and the example's gateway.
//
// Env: GATEWAY_URL, URSULA_URL (direct, for checking what the page claims),
//      CHROMIUM (default /usr/bin/chromium), ARTIFACT_DIR (screenshot goes there).
import { chromium } from "playwright-core";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { check, env, eventually, equal } from "./lib.mjs";

const GATEWAY = env("GATEWAY_URL");
const URSULA = env("URSULA_URL");
const CHROMIUM = process.env.CHROMIUM ?? "/usr/bin/chromium";
const ARTIFACTS = process.env.ARTIFACT_DIR ?? path.join(tmpdir(), "ursula-artifacts");
mkdirSync(ARTIFACTS, { recursive: true });

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
  "--no-first-run",
  "--disable-quic",
];

const userDataDir = mkdtempSync(path.join(tmpdir(), "ursula-chromium-"));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath: CHROMIUM,
  headless: true,
  args: FLAGS,
  viewport: { width: 1200, height: 1000 },
});
const problems = [];

// One pass per stream surface: the bucketed /telemetry/ stream of seed 003 (NDJSON reads,
// record coordinates) and the upstream-compatible /v1/stream/ surface (JSON arrays).
async function runSurface(surface) {
  const page = await context.newPage();
  const tag = (m) => `[${surface}] ${m}`;
  page.on("console", (m) => {
    if (m.type() === "error") problems.push(tag(`console error: ${m.text()}`));
  });
  page.on("pageerror", (e) => problems.push(tag(`page error: ${e.message}`)));
  page.on("response", (r) => {
    if (r.status() >= 400) problems.push(tag(`HTTP ${r.status()} for ${r.request().method()} ${r.url()}`));
  });
  // Everything the page loads must come from the gateway: no other origin, no other host.
  const gatewayOrigin = new URL(GATEWAY).origin;
  page.on("request", (r) => {
    const u = new URL(r.url());
    if (u.origin !== gatewayOrigin && u.protocol !== "data:") problems.push(tag(`request to ${r.url()}`));
  });

  const text = (sel) => page.locator(sel).innerText();
  const count = async (sel) => Number(await text(sel));
  const rows = (tbody) =>
    page.$$eval(`#${tbody} tr`, (trs) => trs.map((tr) => ({ ...tr.dataset, cells: [...tr.cells].map((c) => c.textContent) })));
  const waitCount = (sel, n, what) =>
    eventually(async () => (await count(sel)) === n, tag(`${what}: expected ${n}, page shows`), () => text(sel), 15_000);
  // Reads every stored message directly from the server, as JSON texts in commit order.
  const storedMessages = async (stream) => {
    const r = await fetch(`${URSULA}${stream}?offset=-1`);
    equal(r.status, 200, tag("direct read status"));
    const body = await r.text();
    if (surface === "compat") return JSON.parse(body).map((v) => JSON.stringify(v));
    return body.split("\n").filter(Boolean);
  };

  await page.goto(surface === "compat" ? `${GATEWAY}/?surface=compat` : GATEWAY);
  equal(await page.title(), "Browser telemetry on Ursula", "page title");

  // 1. A session: stream + index created by the gateway, navigation event appended.
  await page.click("#start-session");
  await waitCount("#appended-count", 1, "appended after start");
  const stream = await text("#stream-path");
  const pathPattern = surface === "compat" ? /^\/v1\/stream\/session-[a-z0-9-]+$/ : /^\/telemetry\/session-[a-z0-9-]+$/;
  check(pathPattern.test(stream), tag(`stream path ${stream}`));
  await waitCount("#live-count", 1, "live tail after start");

  // 2. One click event, then an out-of-order batch of six. With MIN_SSE_CONNECTIONS=2
  // (client-tests.sh runs the server with a short sse_max_connection_ms) the batch is
  // sent only after the server ended the first SSE connection and the page resumed from
  // its last control offset, so the live list below proves resumption without gaps or
  // repeats.
  await page.click("#send-click");
  await waitCount("#appended-count", 2, "appended after click");
  await waitCount("#live-count", 2, "live tail after click");
  const minConnections = Number(process.env.MIN_SSE_CONNECTIONS ?? "1");
  const connections = () => page.getAttribute("#live-status", "data-connections").then(Number);
  await eventually(async () => (await connections()) >= minConnections, tag(`SSE connection ${minConnections}`), connections, 15_000);
  await page.click("#send-batch");
  await waitCount("#appended-count", 8, "appended after batch");
  await waitCount("#live-count", 8, "live tail after batch");

  const appended = await rows("appended");
  const live = await rows("live");
  equal(live.map((r) => r.id), appended.map((r) => r.id), tag("live tail delivers every event in commit order"));
  check((await connections()) >= minConnections, tag("SSE connections"));
  const status = await text("#append-status");
  check(status.startsWith("appended 8 events; tail "), tag(`append status: ${status}`));
  const recordCells = appended.map((r) => r.cells[3]);
  equal(recordCells, surface === "compat" ? Array(8).fill("–") : ["0", "1", "2", "3", "4", "5", "6", "7"], tag("record column"));

  // 3. The window query: the page waits for the index, pages, resolves and compares bytes.
  await page.click("#query");
  await eventually(
    async () => /resolved byte-exact|error|MISMATCH|HTTP/i.test(await text("#query-status")),
    tag("query finished"),
    () => text("#query-status"),
    30_000,
  );
  const queryStatus = await text("#query-status");
  const queryClass = await page.getAttribute("#query-status", "class");
  check(!queryClass.includes("error"), tag(`query status is an error: ${queryStatus}`));
  const from = await page.inputValue("#from");
  const until = await page.inputValue("#until");
  const [fromMs, untilMs] = [Date.parse(from), Date.parse(until)];
  const expected = appended
    .map((r, commitOrder) => ({ id: r.id, t: Date.parse(r.capturedAt), commitOrder }))
    .filter((r) => r.t >= fromMs && r.t < untilMs)
    .sort((a, b) => a.t - b.t || a.commitOrder - b.commitOrder);
  check(expected.length >= 4, tag(`expected at least 4 events in the window, computed ${expected.length}`));
  const results = await rows("results");
  equal(results.map((r) => r.id), expected.map((r) => r.id), tag("window query returns the window's events ordered by captured_at"));
  equal(results.map((r) => Number(r.tMs)), expected.map((r) => r.t), tag("t_ms equals captured_at"));
  for (const r of results) {
    equal(r.cells[6], "byte-exact", tag(`event ${r.id} resolved by offset`));
    equal(r.cells[7], surface === "compat" ? "–" : "same", tag(`event ${r.id} resolved by record`));
  }
  equal(queryStatus, `${expected.length} events in [${from}, ${until}); ${expected.length}/${expected.length} resolved byte-exact`, tag("query status"));

  // Replay in 64-byte reads (lines and a multi-byte character split across reads).
  await page.click("#replay");
  await eventually(async () => (await text("#replay-status")).startsWith("replayed"), tag("replay"), () => text("#replay-status"), 15_000);
  const replayStatus = await text("#replay-status");
  check(!(await page.getAttribute("#replay-status", "class")).includes("error"), tag(`replay: ${replayStatus}`));
  check(/^replayed 8 events in \d+ reads; 8\/8 identical to the appends$/.test(replayStatus), tag(`replay status: ${replayStatus}`));
  const reads = Number(replayStatus.match(/in (\d+) reads/)[1]);
  check(reads >= 8, tag(`replay took ${reads} reads of <= 64 bytes`));

  // 4. Check what the page showed against the server directly.
  const messages = await storedMessages(stream);
  equal(messages.map((m) => JSON.parse(m).id), appended.map((r) => r.id), tag("stream holds the appended events in commit order"));
  for (const r of results) {
    const message = messages.find((m) => JSON.parse(m).id === r.id);
    const resolved = await fetch(`${URSULA}${stream}?offset=${r.offset}&max_bytes=${Buffer.byteLength(message) + 1}`);
    equal(await resolved.text(), surface === "compat" ? `[${message}]` : `${message}\n`, tag(`locator of ${r.id} read directly`));
  }

  const shot = path.join(ARTIFACTS, `browser-telemetry-${surface}.png`);
  await page.screenshot({ path: shot, fullPage: true });
  console.log(`screenshot: ${shot}`);

  // 5. keepalive: the pagehide event is delivered although the page is gone.
  await page.goto("about:blank");
  await eventually(
    async () => (await storedMessages(stream)).some((m) => JSON.parse(m).type === "page_hide"),
    tag("page_hide event sent with keepalive during unload"),
    async () => "not in the stream",
    10_000,
  );
  await page.close();
  console.log(`browser telemetry [${surface}]: ok (${appended.length} appended, ${live.length} live, ${results.length} in window, all byte-exact)`);
}

// The gateway forwards appends, reads and index queries, and nothing else.
async function gatewayRefuses() {
  const cases = [
    ["PUT", "/telemetry/new-stream", 405],
    ["DELETE", "/v1/stream/any", 405],
    ["PUT", "/v1/indexes/any", 404],
    ["DELETE", "/v1/indexes/any/status", 405],
    ["POST", "/v1/indexes/any/status/resume", 404],
    ["GET", "/../Cargo.toml", 404],
    ["GET", "/gateway.mjs", 404],
  ];
  for (const [method, p, status] of cases) {
    const r = await fetch(`${GATEWAY}${p}`, { method });
    equal(r.status, status, `gateway ${method} ${p}`);
  }
}

// Without the gateway: a page on another origin (the gateway's) uses ursula directly, so
// the server's CORS answers (preflight, exposed Stream-* headers, SSE) face a real browser.
async function crossOrigin() {
  const page = await context.newPage();
  await page.goto(GATEWAY);
  const result = await page.evaluate(async (ursula) => {
    const stream = `${ursula}/v1/stream/cors-${Date.now().toString(36)}`;
    const created = await fetch(stream, { method: "PUT", headers: { "Content-Type": "application/json" } });
    const appended = await fetch(stream, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify([{ captured_at: new Date().toISOString(), type: "cors" }]),
      keepalive: true,
    });
    const next = appended.headers.get("Stream-Next-Offset");
    const read = await fetch(`${stream}?offset=-1`);
    const live = await new Promise((resolve, reject) => {
      const es = new EventSource(`${stream}?offset=-1&live=sse`);
      es.addEventListener("data", (e) => {
        es.close();
        resolve(e.data);
      });
      es.addEventListener("error", () => {
        es.close();
        reject(new Error("cross-origin EventSource failed"));
      });
    });
    return { created: created.status, appended: appended.status, next, read: await read.text(), upToDate: read.headers.get("Stream-Up-To-Date"), live };
  }, URSULA);
  await page.close();
  equal(result.created, 201, "cross-origin PUT");
  equal(result.appended, 204, "cross-origin keepalive POST (preflighted)");
  check(/^\d+$/.test(result.next ?? ""), `Stream-Next-Offset readable cross-origin: ${result.next}`);
  equal(result.upToDate, "true", "Stream-Up-To-Date readable cross-origin");
  equal(JSON.parse(result.read)[0].type, "cors", "cross-origin read");
  equal(JSON.parse(result.live)[0].type, "cors", "cross-origin EventSource");
  console.log("browser cross-origin (server CORS): ok");
}

try {
  await gatewayRefuses();
  await crossOrigin();
  await runSurface("bucket");
  await runSurface("compat");
  check(problems.length === 0, `browser problems:\n${problems.join("\n")}`);
} finally {
  await context.close();
  rmSync(userDataDir, { recursive: true, force: true });
}
