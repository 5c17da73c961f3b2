// The official TypeScript client, unmodified, against Ursula's compat surface:
// create, append (batched and idempotent), read, tail (SSE and long-poll), close, delete.
// Env: URSULA_URL.
import { DurableStream, FetchError, IdempotentProducer, stream, StreamClosedError } from "@durable-streams/client";
import { check, env, equal, eventually } from "./lib.mjs";

const BASE = `${env("URSULA_URL")}/v1/stream`;
const run = `ts-${Date.now().toString(36)}`;
let passed = 0;

async function test(name, fn) {
  const started = Date.now();
  await fn(`${BASE}/${run}-${name}`);
  passed += 1;
  console.log(`  ok ${name} (${Date.now() - started} ms)`);
}

// Live tail: a subscriber started at the tail sees appends made after it, then the close.
async function tail(url, live) {
  const handle = await DurableStream.connect({ url });
  const { offset } = await handle.head();
  const res = await stream({ url, offset, live });
  const seen = [];
  let closed = false;
  res.subscribeJson(async (batch) => {
    seen.push(...batch.items);
    if (batch.streamClosed) closed = true;
  });
  const values = [{ live, n: 1 }, { live, n: 2 }, { live, n: 3 }];
  for (const v of values) {
    await handle.append(JSON.stringify(v));
    await new Promise((r) => setTimeout(r, 30));
  }
  await eventually(async () => seen.length === values.length, `${live} tail received 3 items`, async () => JSON.stringify(seen));
  await handle.close();
  await eventually(async () => closed, `${live} tail saw streamClosed`, async () => "not closed");
  await res.closed;
  equal(seen, values, `${live} tail items`);
}

await test("json", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "application/json" });
  equal(handle.contentType, "application/json", "content type");
  // Concurrent appends are batched by the client into JSON arrays.
  const values = Array.from({ length: 20 }, (_, i) => ({ i, text: `message ${i}`, nested: { ok: true, list: [i, i * 2] } }));
  await Promise.all(values.map((v) => handle.append(JSON.stringify(v))));
  const items = await (await stream({ url, offset: "-1", live: false })).json();
  // Batched appends keep their call order.
  equal(items, values, "read back every value in order");
  const head = await handle.head();
  check(head.exists && typeof head.offset === "string" && head.offset.length > 0, `head offset ${JSON.stringify(head)}`);
  // Resuming from the returned offset yields nothing new.
  const again = await stream({ url, offset: head.offset, live: false });
  equal(await again.json(), [], "read from the tail");
  equal(again.upToDate, true, "upToDate at the tail");
});

await test("idempotent", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "application/json" });
  const errors = [];
  const producer = new IdempotentProducer(handle, `producer-${run}`, { lingerMs: 5, onError: (e) => errors.push(e) });
  for (let i = 0; i < 50; i++) producer.append(JSON.stringify({ seq: i }));
  await producer.flush();
  await producer.close();
  equal(errors.map(String), [], "producer errors");
  const res = await stream({ url, offset: "-1", live: false });
  equal(await res.json(), Array.from({ length: 50 }, (_, i) => ({ seq: i })), "producer values");
  equal(res.streamClosed, true, "producer close closed the stream");
});

await test("bytes", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "text/plain" });
  const parts = ["hello ", "wörld ", "\u{1F30D}\n", "x".repeat(100_000)];
  for (const p of parts) await handle.append(p);
  equal(await (await stream({ url, offset: "-1", live: false })).text(), parts.join(""), "text read back");
  // A text stream holds UTF-8 only, so every view (SSE included) serves the stored bytes.
  const bin = new Uint8Array(256).map((_, i) => i);
  let error = null;
  try {
    await handle.append(bin);
  } catch (e) {
    error = e;
  }
  check(error?.status === 400, `non-UTF-8 bytes on a text stream are a 400, got ${error}`);
  equal(await (await stream({ url, offset: "-1", live: false })).text(), parts.join(""), "the refused append changed nothing");
  // Arbitrary bytes belong on a binary stream, and come back exactly.
  const binary = await DurableStream.create({ url: `${url}-binary`, contentType: "application/octet-stream" });
  await binary.append(Buffer.from(parts.join("")));
  await binary.append(bin);
  const body = await (await stream({ url: `${url}-binary`, offset: "-1", live: false })).body();
  const expected = Buffer.concat([Buffer.from(parts.join("")), Buffer.from(bin)]);
  check(Buffer.from(body).equals(expected), `bytes read back (${body.length} vs ${expected.length})`);
});

await test("tail-sse", async (url) => {
  await DurableStream.create({ url, contentType: "application/json" });
  await tail(url, "sse");
});

await test("tail-long-poll", async (url) => {
  await DurableStream.create({ url, contentType: "application/json" });
  await tail(url, "long-poll");
});

await test("tail-sse-binary", async (url) => {
  // Binary streams travel over SSE base64-encoded (Stream-SSE-Data-Encoding: base64).
  const handle = await DurableStream.create({ url, contentType: "application/octet-stream" });
  const res = await stream({ url, offset: "-1", live: "sse" });
  const chunks = [];
  res.subscribeBytes(async (c) => {
    chunks.push(Buffer.from(c.data));
  });
  const data = Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 7 + (i >> 8)) % 256));
  await handle.append(new Uint8Array(data.subarray(0, 1000)));
  await handle.append(new Uint8Array(data.subarray(1000)));
  const total = () => chunks.reduce((n, c) => n + c.length, 0);
  await eventually(async () => total() >= data.length, "binary SSE bytes", async () => `${total()} bytes`);
  res.cancel();
  check(Buffer.concat(chunks).equals(data), "binary SSE bytes equal the appends");
});

await test("close", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "application/json" });
  await handle.append(JSON.stringify({ before: "close" }));
  const result = await handle.close();
  check(typeof result.finalOffset === "string" && result.finalOffset.length > 0, `finalOffset ${JSON.stringify(result)}`);
  await handle.close(); // idempotent without a body
  let error = null;
  try {
    await handle.append(JSON.stringify({ after: "close" }));
  } catch (e) {
    error = e;
  }
  // Client 0.2.6's retrying fetch wrapper throws FetchError for any 4xx before its
  // StreamClosedError mapping runs; either way the server must say 409 + Stream-Closed.
  const closedSignal =
    error instanceof StreamClosedError ||
    (error instanceof FetchError && error.status === 409 && error.headers["stream-closed"] === "true");
  check(closedSignal, `append after close: 409 with Stream-Closed: true, got ${error}`);
  const head = await handle.head();
  equal(head.streamClosed, true, "head reports closed");
  equal(head.offset, result.finalOffset, "head offset is the final offset");
  const res = await stream({ url, offset: "-1", live: false });
  equal(await res.json(), [{ before: "close" }], "closed stream still readable");
  equal(res.streamClosed, true, "read reports closed");
});

await test("delete", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "text/plain" });
  await handle.append("bye");
  await handle.delete();
  const head = await DurableStream.head({ url });
  equal(head.exists, false, "head after delete");
  let error = null;
  try {
    await stream({ url, offset: "-1", live: false });
  } catch (e) {
    error = e;
  }
  check(error?.status === 404, `reading a deleted stream fails with 404, got ${error}`);
});

await test("create-options", async (url) => {
  // An initial body, a TTL, and creating an already-closed stream.
  const handle = await DurableStream.create({
    url,
    contentType: "application/json",
    ttlSeconds: 3600,
    body: JSON.stringify([{ first: true }]),
  });
  await handle.append(JSON.stringify({ second: true }));
  equal(await (await stream({ url, offset: "-1", live: false })).json(), [{ first: true }, { second: true }], "initial body + append");
  // Creating again with the same options is idempotent; different options conflict.
  await DurableStream.create({ url, contentType: "application/json", ttlSeconds: 3600 });
  let error = null;
  try {
    await DurableStream.create({ url, contentType: "text/plain" });
  } catch (e) {
    error = e;
  }
  check(error !== null && (error.status ?? error.code) !== undefined, `create with another content type fails, got ${error}`);
  const expires = new Date(Date.now() + 3_600_000).toISOString();
  const closedUrl = `${url}-closed`;
  await DurableStream.create({ url: closedUrl, contentType: "text/plain", expiresAt: expires, body: "all", closed: true });
  const res = await stream({ url: closedUrl, offset: "-1", live: false });
  equal(await res.text(), "all", "closed-at-create stream body");
  equal(res.streamClosed, true, "closed at create");
});

await test("producer-epochs", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "application/json" });
  const errors = [];
  const first = new IdempotentProducer(handle, `epochs-${run}`, { epoch: 0, lingerMs: 1, onError: (e) => errors.push(e) });
  first.append(JSON.stringify({ from: "epoch0" }));
  await first.flush();
  // A new incarnation of the producer claims a higher epoch; the old one is fenced.
  const second = new IdempotentProducer(handle, `epochs-${run}`, { epoch: 1, lingerMs: 1, onError: (e) => errors.push(e) });
  second.append(JSON.stringify({ from: "epoch1" }));
  await second.flush();
  first.append(JSON.stringify({ from: "zombie" }));
  await first.flush().catch((e) => errors.push(e));
  check(errors.some((e) => e.name === "StaleEpochError" || /epoch/i.test(String(e))), `stale epoch rejected: ${errors.map(String)}`);
  // autoClaim: a producer that does not know the current epoch takes the next one.
  const errors3 = [];
  const third = new IdempotentProducer(handle, `epochs-${run}`, { epoch: 0, autoClaim: true, lingerMs: 1, onError: (e) => errors3.push(e) });
  third.append(JSON.stringify({ from: "autoclaim" }));
  await third.flush();
  equal(errors3.map(String), [], "autoClaim errors");
  equal(
    await (await stream({ url, offset: "-1", live: false })).json(),
    [{ from: "epoch0" }, { from: "epoch1" }, { from: "autoclaim" }],
    "only unfenced appends are stored",
  );
});

await test("seq", async (url) => {
  const handle = await DurableStream.create({ url, contentType: "text/plain", batching: false });
  await handle.append("a", { seq: "0001" });
  await handle.append("b", { seq: "0002" });
  let error = null;
  try {
    await handle.append("c", { seq: "0002" });
  } catch (e) {
    error = e;
  }
  check(error?.status === 409, `a repeated Stream-Seq is a 409, got ${error}`);
  equal(await (await stream({ url, offset: "-1", live: false })).text(), "ab", "seq-ordered appends");
});

await test("live-auto", async (url) => {
  // live: true lets the client pick its live mode; json() stops at the first up-to-date.
  const handle = await DurableStream.create({ url, contentType: "application/json" });
  await handle.append(JSON.stringify({ n: 1 }));
  const res = await stream({ url, offset: "-1", live: true });
  equal(await res.json(), [{ n: 1 }], "live json() up to date");
  const later = await stream({ url, offset: res.offset, live: true });
  const seen = [];
  later.subscribeJson((batch) => {
    seen.push(...batch.items);
  });
  await handle.append(JSON.stringify({ n: 2 }));
  await eventually(async () => seen.length === 1, "auto live tail", async () => JSON.stringify(seen));
  later.cancel();
  equal(seen, [{ n: 2 }], "auto live items");
});

console.log(`@durable-streams/client: ${passed} tests passed`);
