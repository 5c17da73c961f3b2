// A stock OpenTelemetry OTLP/HTTP JSON trace exporter posts spans to an Ursula stream
// (one application/json stream per service, signal and UTC day; gzip-compressed, the
// Collector's default, which the server decodes), and an
// ursula-indexer index with the OTLP trace extractor answers match=overlap queries whose
// locators resolve, byte-exact, to the exported batches.
// Env: URSULA_URL, INDEXER_URL.
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-http";
import { LoggerProvider, SimpleLogRecordProcessor } from "@opentelemetry/sdk-logs";
import { check, env, equal, eventually, http } from "./lib.mjs";

const URSULA = env("URSULA_URL");
const INDEXER = env("INDEXER_URL");

// Spans at fixed offsets from t0 so the windows below have known answers.
const t0 = Math.floor(Date.now() / 1000) * 1000 - 60_000;
const day = new Date(t0).toISOString().slice(0, 10).replaceAll("-", "");
const name = `traces-checkout-${day}`;
const streamUrl = `${URSULA}/otel/${name}`;

await http("PUT", `${URSULA}/otel`, { status: [201, 409] });
await http("PUT", streamUrl, { headers: { "content-type": "application/json" }, status: 201 });
const registration = {
  stream_url: streamUrl,
  extract: {
    each: "/resourceSpans/*/scopeSpans/*/spans/*",
    time: ["/startTimeUnixNano"],
    end: ["/endTimeUnixNano"],
    unit: "ns",
  },
};
const reg = await http("PUT", `${INDEXER}/v1/indexes/${name}`, {
  headers: { "content-type": "application/json" },
  body: JSON.stringify(registration),
  status: 201,
});
equal(JSON.parse(reg.text).stream_url, streamUrl, "registered stream_url");

const exporter = new OTLPTraceExporter({ url: streamUrl, compression: "gzip", timeoutMillis: 5000 });
// Record what the exporter itself concluded about each export (0 = SUCCESS).
const results = [];
const exportOnce = exporter.export.bind(exporter);
exporter.export = (spans, done) =>
  exportOnce(spans, (result) => {
    results.push(result.code === 0 ? "ok" : `failed: ${result.error}`);
    done(result);
  });
const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ "service.name": "checkout" }),
  spanProcessors: [new BatchSpanProcessor(exporter, { maxExportBatchSize: 512, scheduledDelayMillis: 60_000 })],
});
const tracer = provider.getTracer("ursula-otel-test", "1.0.0");
// Dates, not numbers: the SDK reads a number below performance.timeOrigin as a
// performance.now() value.
const at = (ms) => new Date(t0 + ms);
const span = (spanName, startMs, endMs) => tracer.startSpan(spanName, { startTime: at(startMs) }).end(at(endMs));

// Batch A: one export request with three spans; B: a later request with two.
span("GET /cart", 0, 500);
span("SELECT cart_items", 200, 2000);
span("render", 600, 700);
await provider.forceFlush();
span("POST /checkout", 10_000, 11_000);
span("charge card", 10_100, 10_900);
await provider.forceFlush();
await provider.shutdown();
equal(results, ["ok", "ok"], "exporter results");

// Each export request is one message in the stream: read them back as NDJSON.
const all = await http("GET", `${streamUrl}?offset=-1`, { status: 200 });
const tail = all.headers.get("stream-next-offset");
const messages = all.text.split("\n").filter(Boolean);
equal(messages.length, 2, "export requests stored as messages");
const spanNames = (msg) =>
  JSON.parse(msg).resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans.map((s) => s.name)));
equal(spanNames(messages[0]), ["GET /cart", "SELECT cart_items", "render"], "batch A spans");
equal(spanNames(messages[1]), ["POST /checkout", "charge card"], "batch B spans");
const service = JSON.parse(messages[0]).resourceSpans[0].resource.attributes.find((a) => a.key === "service.name");
equal(service?.value?.stringValue, "checkout", "resource service.name");

const query = async (from, until, match) => {
  const m = match ? `&match=${match}` : "";
  return JSON.parse((await http("GET", `${INDEXER}/v1/indexes/${name}/events?from=${t0 + from}&until=${t0 + until}${m}`, { status: 200 })).text);
};
await eventually(
  async () => (await query(0, 1, null)).coverage.through >= tail,
  `index covering ${tail}`,
  async () => JSON.stringify((await query(0, 1, null)).coverage),
  20_000,
);

// A window inside batch A's span (its slowest span runs to t0+2000) but after every
// span start: only match=overlap finds it.
equal((await query(1500, 1600, null)).entries, [], "match=start inside batch A");
const overlapA = await query(1500, 1600, "overlap");
equal(overlapA.entries.map((e) => [e.t_ms, e.t_end_ms]), [[t0, t0 + 2000]], "match=overlap finds batch A's span");
const overlapB = await query(10_950, 10_960, "overlap");
equal(overlapB.entries.map((e) => [e.t_ms, e.t_end_ms]), [[t0 + 10_000, t0 + 11_000]], "match=overlap finds batch B");
const both = await query(1999, 10_001, "overlap");
equal(both.entries.length, 2, "a window touching both batches");
equal((await query(2001, 9_999, "overlap")).entries, [], "the gap between the batches");
equal(both.skipped, { missing: 0, invalid: 0, unparseable: 0, oversize: 0 }, "nothing skipped");

// Locators resolve, through the server, to the exported request bodies.
for (const [entry, msg] of [[overlapA.entries[0], messages[0]], [overlapB.entries[0], messages[1]]]) {
  let offset = entry.offset;
  let got = Buffer.alloc(0);
  while (got.length < entry.len) {
    const r = await fetch(`${streamUrl}?offset=${offset}&max_bytes=${entry.len - got.length}`);
    check(r.ok, `resolve ${entry.offset}: ${r.status}`);
    const chunk = Buffer.from(await r.arrayBuffer());
    check(chunk.length > 0, "empty chunk while resolving");
    got = Buffer.concat([got, chunk]);
    offset = r.headers.get("stream-next-offset");
  }
  equal(got.toString(), `${msg}\n`, `locator ${entry.offset} resolves to its export request`);
}
console.log(`otel traces: ok (2 OTLP/JSON export requests, 5 spans, overlap queries on ${name})`);

// ---- Logs: the logs exporter, with the seed's fallback from an unset timeUnixNano (0)
// to observedTimeUnixNano.
const logsName = `logs-checkout-${day}`;
const logsUrl = `${URSULA}/otel/${logsName}`;
await http("PUT", logsUrl, { headers: { "content-type": "application/json" }, status: 201 });
await http("PUT", `${INDEXER}/v1/indexes/${logsName}`, {
  headers: { "content-type": "application/json" },
  body: JSON.stringify({
    stream_url: logsUrl,
    extract: {
      each: "/resourceLogs/*/scopeLogs/*/logRecords/*",
      time: ["/timeUnixNano", "/observedTimeUnixNano"],
      unit: "ns",
    },
  }),
  status: 201,
});
const logResults = [];
const logExporter = new OTLPLogExporter({ url: logsUrl, compression: "none", timeoutMillis: 5000 });
const exportLogs = logExporter.export.bind(logExporter);
logExporter.export = (records, done) =>
  exportLogs(records, (result) => {
    logResults.push(result.code === 0 ? "ok" : `failed: ${result.error}`);
    done(result);
  });
// SimpleLogRecordProcessor: one export request (one stream message) per record. The JS
// SDK always fills in an event time, so a processor in front of it clears the time of
// records marked `test.unset_time`, as OTLP records bridged from sources without one
// arrive (timeUnixNano 0 means unknown).
const simple = new SimpleLogRecordProcessor(logExporter);
const unsetTime = {
  onEmit(record, context) {
    if (record.attributes["test.unset_time"]) record.hrTime = [0, 0];
    simple.onEmit(record, context);
  },
  forceFlush: () => simple.forceFlush(),
  shutdown: () => simple.shutdown(),
};
const loggerProvider = new LoggerProvider({
  resource: resourceFromAttributes({ "service.name": "checkout" }),
  processors: [unsetTime],
});
const logger = loggerProvider.getLogger("ursula-otel-test");
logger.emit({ timestamp: at(20_000), observedTimestamp: at(20_050), severityText: "INFO", body: "cart loaded" });
logger.emit({
  observedTimestamp: at(20_300),
  severityText: "WARN",
  body: "no event time",
  attributes: { "test.unset_time": true },
});
logger.emit({ timestamp: at(25_000), severityText: "ERROR", body: "payment declined" });
await loggerProvider.forceFlush();
await loggerProvider.shutdown();
equal(logResults, ["ok", "ok", "ok"], "log exporter results");

const logsAll = await http("GET", `${logsUrl}?offset=-1`, { status: 200 });
const logMessages = logsAll.text.split("\n").filter(Boolean);
equal(logMessages.length, 3, "log export requests stored as messages");
// SimpleLogRecordProcessor exports concurrently, so the messages' order is not the emit order.
const records = logMessages.map((m) => JSON.parse(m).resourceLogs[0].scopeLogs[0].logRecords[0]);
const unset = records.filter((r) => r.attributes?.some((a) => a.key === "test.unset_time"));
equal(unset.length, 1, "one record without an event time");
check(
  unset[0].timeUnixNano === 0 || unset[0].timeUnixNano === "0",
  `the exporter sent an unset time as 0: ${JSON.stringify(unset[0].timeUnixNano)}`,
);
const logsTail = logsAll.headers.get("stream-next-offset");
const logQuery = async (from, until) =>
  JSON.parse((await http("GET", `${INDEXER}/v1/indexes/${logsName}/events?from=${t0 + from}&until=${t0 + until}`, { status: 200 })).text);
await eventually(
  async () => (await logQuery(0, 1)).coverage.through >= logsTail,
  `logs index covering ${logsTail}`,
  async () => JSON.stringify((await logQuery(0, 1)).coverage),
  20_000,
);
const logWindow = await logQuery(20_000, 21_000);
equal(logWindow.entries.map((e) => e.t_ms), [t0 + 20_000, t0 + 20_300], "log times, the second from observedTimeUnixNano");
equal(logWindow.entries[1].offset, (await logQuery(20_300, 20_301)).entries[0].offset, "the fallback record's locator");
equal((await logQuery(24_999, 25_001)).entries.map((e) => e.t_ms), [t0 + 25_000], "the third log");
equal((await logQuery(-1_000_000, 1_000_000)).skipped.missing, 0, "no record counted as missing");
console.log(`otel logs: ok (3 OTLP/JSON log exports, timeUnixNano 0 fell back to observedTimeUnixNano on ${logsName})`);
