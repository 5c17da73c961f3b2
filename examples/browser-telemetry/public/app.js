// Browser telemetry on Ursula: append, tail live, query by event time, resolve locators.
// Plain browser JavaScript, no build step. Every URL is same-origin: gateway.mjs forwards
// /telemetry/* and /v1/stream/* to ursula and /v1/indexes/*/events to ursula-indexer.

const $ = (id) => document.getElementById(id);

// ?surface=compat runs the page against a /v1/stream/ stream (JSON read back as arrays,
// no record coordinates) instead of a bucketed /telemetry/ stream (NDJSON, records).
const SURFACE = new URLSearchParams(location.search).get("surface") === "compat" ? "compat" : "bucket";

const state = {
  stream: null, // "/telemetry/session-…"
  index: null, // index id
  incarnation: null,
  tail: null, // Stream-Next-Offset of our latest acknowledged append
  sent: new Map(), // event id -> the exact JSON text we appended
  seq: 0,
  live: null, // EventSource
  liveOffset: "-1",
  liveCount: 0,
  liveConnections: 0,
};

function setStatus(id, text, ok = true) {
  const el = $(id);
  el.textContent = text;
  el.classList.toggle("error", !ok);
}

function row(tbody, cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    const td = document.createElement("td");
    if (cell && typeof cell === "object") {
      td.textContent = cell.text;
      if (cell.cls) td.className = cell.cls;
    } else {
      td.textContent = cell ?? "";
    }
    tr.appendChild(td);
  }
  tbody.appendChild(tr);
  return tr;
}

function nextId() {
  state.seq += 1;
  return `e${state.seq}`;
}

// Append events exactly as the seed shows: one JSON array per request, keepalive so that
// events sent while the page unloads still arrive.
async function append(events) {
  for (const ev of events) state.sent.set(ev.id, JSON.stringify(ev));
  const response = await fetch(state.stream, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(events),
    keepalive: true,
  });
  if (!response.ok) throw new Error(`append: HTTP ${response.status} ${await response.text()}`);
  const next = response.headers.get("Stream-Next-Offset");
  const recStart = response.headers.get("Stream-Record-Start");
  const recNext = response.headers.get("Stream-Record-Next");
  state.tail = next;
  // Record ordinals are the one coordinate clients may do arithmetic on (seed 000): the
  // batch occupies [Stream-Record-Start, Stream-Record-Next), one record per element.
  const records = recStart !== null && recNext !== null;
  if (records && Number(recNext) - Number(recStart) !== events.length) {
    throw new Error(`append: records [${recStart}, ${recNext}) for ${events.length} events`);
  }
  for (const [i, ev] of events.entries()) {
    const record = records ? String(Number(recStart) + i) : "–";
    const tr = row($("appended"), [ev.id, ev.type, ev.captured_at, record, next]);
    tr.dataset.id = ev.id;
    tr.dataset.capturedAt = ev.captured_at;
  }
  $("appended-count").textContent = String(state.sent.size);
  setStatus("append-status", `appended ${state.sent.size} events; tail ${next}`);
  return next;
}

// ---- live tail ------------------------------------------------------------------------
// EventSource reconnects to its original URL on its own, which would replay from the
// first offset. Instead every error closes it and a new one resumes from the last
// control event's streamNextOffset.
function startLive() {
  if (state.live) state.live.close();
  const es = new EventSource(`${state.stream}?offset=${encodeURIComponent(state.liveOffset)}&live=sse`);
  state.live = es;
  es.addEventListener("open", () => {
    state.liveConnections += 1;
    $("live-status").dataset.connections = String(state.liveConnections);
    setStatus("live-status", `connection ${state.liveConnections} from offset ${state.liveOffset}`);
  });
  es.addEventListener("data", (msg) => {
    // Bucketed JSON streams deliver NDJSON, one event per line of the SSE data field;
    // the compat surface delivers one JSON array per data event.
    const events = SURFACE === "compat"
      ? JSON.parse(msg.data)
      : msg.data.split("\n").filter(Boolean).map((line) => JSON.parse(line));
    // No de-duplication: resuming from the last control offset must neither repeat nor
    // skip an event, and the test checks this list against the appends.
    for (const ev of events) {
      state.liveCount += 1;
      const tr = row($("live"), [ev.id, ev.type, ev.captured_at]);
      tr.dataset.id = ev.id;
    }
    $("live-count").textContent = String(state.liveCount);
  });
  es.addEventListener("control", (msg) => {
    const c = JSON.parse(msg.data);
    if (c.streamNextOffset) state.liveOffset = c.streamNextOffset;
    setStatus("live-status", `live; ${state.liveCount} events; next offset ${state.liveOffset}; connection ${state.liveConnections}`);
  });
  es.addEventListener("error", () => {
    es.close();
    if (state.live !== es) return;
    setStatus("live-status", `reconnecting from ${state.liveOffset}`);
    setTimeout(() => state.live === es && startLive(), 250);
  });
}

// ---- event-time query and locator resolution ----------------------------------------
// Offsets are opaque, fixed-width tokens: compare them only with each other.
const offsetAtLeast = (a, b) => a.length === b.length ? a >= b : a.length > b.length;

async function fetchJson(url) {
  const response = await fetch(url);
  const text = await response.text();
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status} ${text}`);
  return JSON.parse(text);
}

// The seed's fetchEvent: read from the locator's offset until len bytes have arrived,
// continuing from each response's Stream-Next-Offset; never compute an offset.
async function fetchEventBytes(streamUrl, { offset, len }) {
  const chunks = [];
  let received = 0;
  while (received < len) {
    const response = await fetch(`${streamUrl}?offset=${offset}&max_bytes=${len - received}`);
    if (!response.ok) throw new Error(`event is no longer readable: ${response.status}`);
    const chunk = new Uint8Array(await response.arrayBuffer());
    if (chunk.length === 0) throw new Error("event is no longer readable");
    chunks.push(chunk);
    received += chunk.length;
    offset = response.headers.get("Stream-Next-Offset");
  }
  const bytes = new Uint8Array(received);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.length;
  }
  return bytes;
}

// Record coordinates (json-record-coordinates-v1): the same event by its ordinal.
async function fetchRecordText(streamUrl, record) {
  const response = await fetch(`${streamUrl}?record=${record}&max_records=1`);
  if (!response.ok) throw new Error(`record ${record}: HTTP ${response.status}`);
  return response.text();
}

async function fetchCompatEvent(streamUrl, { offset, len }) {
  const response = await fetch(`${streamUrl}?offset=${offset}&max_bytes=${len}`);
  if (!response.ok) throw new Error(`event is no longer readable: ${response.status}`);
  const text = await response.text();
  const [ev] = JSON.parse(text);
  const sent = state.sent.get(ev.id);
  return { ev, text, okOffset: sent !== undefined && text === `[${sent}]` };
}

const sameBytes = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

async function queryWindow() {
  const from = $("from").value.trim();
  const until = $("until").value.trim();
  if (!from || !until) throw new Error("set from and until");
  $("results").replaceChildren();
  $("result-count").textContent = "0";
  const base = `/v1/indexes/${state.index}/events?from=${encodeURIComponent(from)}&until=${encodeURIComponent(until)}&limit=100`;

  // The index catches up asynchronously: wait until it covers our last append.
  setStatus("query-status", "waiting for the index to cover our appends…");
  let page;
  const deadline = Date.now() + 30_000;
  for (;;) {
    page = await fetchJson(base);
    if (!state.tail || offsetAtLeast(page.coverage.through, state.tail)) break;
    if (Date.now() > deadline) throw new Error(`index still at ${page.coverage.through}, tail ${state.tail}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  const through = page.coverage.through;
  const entries = [...page.entries];
  while (page.next) {
    page = await fetchJson(`${base}&after=${page.next}&through=${through}`);
    entries.push(...page.entries);
  }

  // Locators are valid for the incarnation the index is bound to.
  const head = await fetch(state.stream, { method: "HEAD" });
  const incarnation = head.headers.get("Stream-Incarnation");
  if (page.source.incarnation && incarnation !== page.source.incarnation) {
    throw new Error(`stream was recreated: incarnation ${incarnation}, index ${page.source.incarnation}`);
  }
  const sk = page.skipped;
  $("coverage").textContent =
    `through ${through}, complete ${page.coverage.complete}, incarnation ${page.source.incarnation}; ` +
    `skipped missing ${sk.missing}, invalid ${sk.invalid}, unparseable ${sk.unparseable}, oversize ${sk.oversize}`;

  const encoder = new TextEncoder();
  let exact = 0;
  for (const entry of entries) {
    let ev, text, okOffset;
    if (SURFACE === "compat") {
      // The compat surface renders JSON reads as arrays of whole messages, so one read
      // of len stored bytes is the array holding exactly this event.
      ({ ev, text, okOffset } = await fetchCompatEvent(state.stream, entry));
    } else {
      const bytes = await fetchEventBytes(state.stream, entry);
      text = new TextDecoder().decode(bytes);
      ev = JSON.parse(text);
      const sent = state.sent.get(ev.id);
      okOffset = sent !== undefined && sameBytes(bytes, encoder.encode(`${sent}\n`));
    }
    let okRecord = null;
    if (entry.record !== undefined && entry.record !== null) {
      okRecord = (await fetchRecordText(state.stream, entry.record)) === text;
    }
    if (okOffset && okRecord !== false) exact += 1;
    const tr = row($("results"), [
      new Date(entry.t_ms).toISOString(),
      entry.offset,
      String(entry.len),
      entry.record ?? "–",
      ev.id,
      ev.type,
      { text: okOffset ? "byte-exact" : "MISMATCH", cls: okOffset ? "ok" : "bad" },
      okRecord === null ? "–" : { text: okRecord ? "same" : "MISMATCH", cls: okRecord ? "ok" : "bad" },
    ]);
    tr.dataset.id = ev.id;
    tr.dataset.tMs = String(entry.t_ms);
    tr.dataset.offset = entry.offset;
  }
  $("result-count").textContent = String(entries.length);
  const allOk = exact === entries.length;
  setStatus(
    "query-status",
    `${entries.length} events in [${from}, ${until}); ${exact}/${entries.length} resolved byte-exact`,
    allOk,
  );
}

// ---- replay ---------------------------------------------------------------------------
// Seed 003's replay loop: read from offset -1, continue from each Stream-Next-Offset until
// Stream-Up-To-Date. A bucketed read can end mid-line (and mid-character), so text is
// decoded as a stream and an incomplete trailing line waits for the next read. Small
// reads (max_bytes=64) make that happen on every event.
async function replay() {
  const decoder = new TextDecoder();
  let offset = "-1";
  let pending = "";
  let reads = 0;
  const texts = [];
  for (;;) {
    const response = await fetch(`${state.stream}?offset=${offset}&max_bytes=64`);
    if (!response.ok) throw new Error(`replay: HTTP ${response.status}`);
    reads += 1;
    const chunk = new Uint8Array(await response.arrayBuffer());
    if (SURFACE === "compat") {
      // Compat JSON reads are arrays of whole messages.
      if (chunk.length) texts.push(...JSON.parse(decoder.decode(chunk)).map((v) => JSON.stringify(v)));
    } else {
      pending += decoder.decode(chunk, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop();
      texts.push(...lines);
    }
    offset = response.headers.get("Stream-Next-Offset");
    if (response.headers.get("Stream-Up-To-Date") === "true") break;
  }
  if (pending) throw new Error(`replay ended inside a line: ${pending}`);
  let same = 0;
  for (const text of texts) if (state.sent.get(JSON.parse(text).id) === text) same += 1;
  const ok = same === texts.length && texts.length === state.sent.size;
  setStatus(
    "replay-status",
    `replayed ${texts.length} events in ${reads} reads; ${same}/${state.sent.size} identical to the appends`,
    ok,
  );
}

// ---- buttons --------------------------------------------------------------------------
function guard(statusId, fn) {
  return async () => {
    try {
      await fn();
    } catch (err) {
      console.error(err);
      setStatus(statusId, String(err.message ?? err), false);
    }
  };
}

$("start-session").addEventListener(
  "click",
  guard("append-status", async () => {
    $("start-session").disabled = true;
    const response = await fetch(`/api/sessions?surface=${SURFACE}`, { method: "POST" });
    const body = await response.json();
    if (!response.ok) throw new Error(`session: ${body.error ?? response.status}`);
    Object.assign(state, { stream: body.stream, index: body.index, incarnation: body.incarnation });
    $("stream-path").textContent = body.stream;
    $("index-id").textContent = body.index;
    startLive();
    const nav = performance.getEntriesByType("navigation")[0];
    await append([{
      id: nextId(),
      captured_at: new Date().toISOString(),
      type: "navigation",
      duration_ms: nav ? Math.round(nav.duration) : null,
      path: location.pathname,
    }]);
    for (const id of ["send-click", "send-batch", "query", "replay"]) $(id).disabled = false;
  }),
);

$("send-click").addEventListener(
  "click",
  guard("append-status", async () => {
    await append([{ id: nextId(), captured_at: new Date().toISOString(), type: "click", target: "send-click" }]);
  }),
);

// A batch as it might arrive after offline buffering: captured_at out of commit order,
// two of the events outside the one-second window the button proposes.
$("send-batch").addEventListener(
  "click",
  guard("append-status", async () => {
    const base = Date.now();
    const at = (ms) => new Date(base + ms).toISOString();
    await append([
      { id: nextId(), captured_at: at(300), type: "network_response", status: 500, url: "/api/cart" },
      { id: nextId(), captured_at: at(100), type: "long_task", duration_ms: 180 },
      { id: nextId(), captured_at: at(5000), type: "visibility", state: "hidden" },
      { id: nextId(), captured_at: at(200), type: "network_response", status: 200, url: "/api/items" },
      { id: nextId(), captured_at: at(-2000), type: "error", message: "TypeError: x is undefined — Größe €" },
      { id: nextId(), captured_at: at(900), type: "web_vital", name: "LCP", value: 1234.5 },
    ]);
    $("from").value = at(0);
    $("until").value = at(1000);
  }),
);

$("query").addEventListener("click", guard("query-status", queryWindow));
$("replay").addEventListener("click", guard("replay-status", replay));

// The reason for keepalive: an event sent as the page goes away still gets delivered.
addEventListener("pagehide", () => {
  if (!state.stream) return;
  const ev = { id: nextId(), captured_at: new Date().toISOString(), type: "page_hide" };
  fetch(state.stream, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify([ev]),
    keepalive: true,
  });
});
