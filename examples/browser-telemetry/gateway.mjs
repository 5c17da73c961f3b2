#!/usr/bin/env node
// Same-origin gateway for the browser telemetry example.
//
//   node gateway.mjs [--listen 127.0.0.1:8080] [--ursula http://127.0.0.1:4437]
//                    [--indexer http://127.0.0.1:4493]
//
// It serves the static page in ./public and forwards, unchanged and unbuffered:
//   GET/HEAD/POST /telemetry/{stream}          -> ursula   (the bucketed JSON streams)
//   GET/HEAD/POST /v1/stream/{id}              -> ursula   (the compat surface)
//   GET /v1/indexes/{id}/events, /status       -> ursula-indexer (read-only routes)
// and owns the one admin action the page needs:
//   POST /api/sessions  -> creates the `telemetry` bucket (once), a new JSON stream in
//                          it, and registers an event-time index on that stream;
//                          with ?surface=compat the stream is /v1/stream/{name} instead.
// Stream creation, deletion and index registration are not forwarded: the browser can
// append to and read streams, but only the gateway decides which streams exist and what
// the indexer reads. Nothing here needs npm packages.

import http from "node:http";
import { readFile } from "node:fs/promises";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PUBLIC = path.join(HERE, "public");

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  const env = process.env[`GATEWAY_${name.toUpperCase()}`];
  return env ?? fallback;
}

const LISTEN = arg("listen", "127.0.0.1:8080");
const URSULA = new URL(arg("ursula", "http://127.0.0.1:4437"));
const INDEXER = new URL(arg("indexer", "http://127.0.0.1:4493"));
const BUCKET = "telemetry";

const HOP_BY_HOP = new Set([
  "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
  "trailer", "transfer-encoding", "upgrade", "host",
]);

const STATIC = {
  "/": ["index.html", "text/html; charset=utf-8"],
  "/index.html": ["index.html", "text/html; charset=utf-8"],
  "/app.js": ["app.js", "text/javascript; charset=utf-8"],
  "/style.css": ["style.css", "text/css; charset=utf-8"],
};

function log(...args) {
  if (!process.env.GATEWAY_QUIET) console.error(new Date().toISOString(), ...args);
}

function sendJson(res, status, value) {
  const body = JSON.stringify(value);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    "cache-control": "no-store",
  });
  res.end(body);
}

function copyHeaders(raw) {
  const out = {};
  for (const [k, v] of Object.entries(raw)) {
    if (!HOP_BY_HOP.has(k.toLowerCase())) out[k] = v;
  }
  return out;
}

// Forwards one request to `upstream`, streaming both bodies (SSE responses stay live).
function forward(req, res, upstream) {
  const headers = copyHeaders(req.headers);
  headers.host = upstream.host;
  const up = http.request(
    {
      protocol: upstream.protocol,
      hostname: upstream.hostname,
      port: upstream.port,
      method: req.method,
      path: req.url,
      headers,
    },
    (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, copyHeaders(upRes.headers));
      res.flushHeaders();
      upRes.pipe(res);
      upRes.on("error", () => res.destroy());
    },
  );
  up.on("error", (err) => {
    log("upstream error", req.method, req.url, err.message);
    if (!res.headersSent) sendJson(res, 502, { error: `upstream: ${err.message}` });
    else res.destroy();
  });
  // A browser that goes away (closed EventSource, navigation) ends the upstream request.
  res.on("close", () => up.destroy());
  req.pipe(up);
}

// A small request to an upstream, body buffered; used by the session setup only.
function call(base, method, pathname, { headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const r = http.request(
      { hostname: base.hostname, port: base.port, method, path: pathname, headers },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () =>
          resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString() }),
        );
        res.on("error", reject);
      },
    );
    r.on("error", reject);
    r.end(body);
  });
}

// surface "bucket" (default): /telemetry/{name}, JSON read back as NDJSON, with record
// coordinates. surface "compat": /v1/stream/{name}, the upstream-compatible surface, JSON
// read back as arrays.
async function createSession(surface) {
  const name = `session-${Date.now().toString(36)}-${randomBytes(4).toString("hex")}`;
  let streamPath = `/v1/stream/${name}`;
  if (surface !== "compat") {
    // The bucket exists after the first session: 201 the first time, 409 after.
    const bucket = await call(URSULA, "PUT", `/${BUCKET}`);
    if (bucket.status !== 201 && bucket.status !== 409) {
      throw new Error(`PUT /${BUCKET}: ${bucket.status} ${bucket.text}`);
    }
    streamPath = `/${BUCKET}/${name}`;
  }
  const created = await call(URSULA, "PUT", streamPath, {
    headers: { "content-type": "application/json" },
  });
  if (created.status !== 201) throw new Error(`PUT ${streamPath}: ${created.status} ${created.text}`);
  const streamUrl = new URL(streamPath, URSULA).href;
  const registration = JSON.stringify({ stream_url: streamUrl, extract: { time: ["/captured_at"] } });
  const reg = await call(INDEXER, "PUT", `/v1/indexes/${name}`, {
    headers: { "content-type": "application/json" },
    body: registration,
  });
  if (reg.status !== 201) throw new Error(`PUT /v1/indexes/${name}: ${reg.status} ${reg.text}`);
  const stored = JSON.parse(reg.text);
  log("session", streamPath, "index", name);
  return { stream: streamPath, index: name, incarnation: stored.incarnation ?? null, surface: surface === "compat" ? "compat" : "bucket" };
}

async function serveStatic(req, res, file, type) {
  try {
    const body = await readFile(path.join(PUBLIC, file));
    res.writeHead(200, { "content-type": type, "content-length": body.length, "cache-control": "no-store" });
    res.end(req.method === "HEAD" ? undefined : body);
  } catch (err) {
    sendJson(res, 500, { error: err.message });
  }
}

const STREAM_PATH = /^\/(?:telemetry|v1\/stream)\/[A-Za-z0-9._~-]+$/;
const INDEX_PATH = /^\/v1\/indexes\/[a-z0-9_-]{1,122}\/(?:events|status)$/;

const server = http.createServer(async (req, res) => {
  const { pathname, searchParams } = new URL(req.url, "http://gateway");
  const stat = STATIC[pathname];
  if (stat && (req.method === "GET" || req.method === "HEAD")) return serveStatic(req, res, ...stat);
  if (pathname === "/api/sessions" && req.method === "POST") {
    try {
      return sendJson(res, 201, await createSession(searchParams.get("surface")));
    } catch (err) {
      log("session failed:", err.message);
      return sendJson(res, 502, { error: err.message });
    }
  }
  if (STREAM_PATH.test(pathname)) {
    if (["GET", "HEAD", "POST"].includes(req.method)) return forward(req, res, URSULA);
    return sendJson(res, 405, { error: "the gateway forwards only GET, HEAD and POST to streams" });
  }
  if (INDEX_PATH.test(pathname)) {
    if (req.method === "GET") return forward(req, res, INDEXER);
    return sendJson(res, 405, { error: "the gateway forwards only index queries" });
  }
  sendJson(res, 404, { error: "not found" });
});

const [host, port] = [LISTEN.slice(0, LISTEN.lastIndexOf(":")), Number(LISTEN.slice(LISTEN.lastIndexOf(":") + 1))];
server.listen(port, host, () => {
  const a = server.address();
  console.log(`gateway listening on http://${a.address}:${a.port}`);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections();
    process.exit(0);
  });
}
