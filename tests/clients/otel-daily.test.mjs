// The OpenTelemetry JS OTLP/HTTP JSON exporters, gzip-compressed (the Collector's
// default), post into one stream per service, signal and UTC day that nobody created: the
// bucket's `auto_create` setting creates each on its first export, with the bucket's
// content type and TTL, as the daily-stream recipe relies on at midnight.
// Env: URSULA_URL.
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { OTLPLogExporter } from "@opentelemetry/exporter-logs-otlp-http";
import { BatchLogRecordProcessor, LoggerProvider } from "@opentelemetry/sdk-logs";
import { check, env, equal, http } from "./lib.mjs";

const URSULA = env("URSULA_URL");
const BUCKET = "otel-daily-js";
const TTL = "259200";

// Records what the exporter itself concluded about each export (0 = SUCCESS).
function recorded(exporter, results) {
  const exportOnce = exporter.export.bind(exporter);
  exporter.export = (items, done) =>
    exportOnce(items, (result) => {
      results.push(result.code === 0 ? "ok" : `failed: ${result.error}`);
      done(result);
    });
  return exporter;
}

await http("PUT", `${URSULA}/${BUCKET}`, {
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ auto_create: { content_type: "application/json", ttl_seconds: Number(TTL) } }),
  status: 201,
});
const day = new Date().toISOString().slice(0, 10).replaceAll("-", "");
const tracesUrl = `${URSULA}/${BUCKET}/traces-checkout-${day}`;
const logsUrl = `${URSULA}/${BUCKET}/logs-checkout-${day}`;
for (const url of [tracesUrl, logsUrl]) {
  equal((await http("HEAD", url)).status, 404, `${url} before the first export`);
}

// ---- traces: two export requests, the first of which creates the stream.
const traceResults = [];
const traceExporter = recorded(
  new OTLPTraceExporter({ url: tracesUrl, compression: "gzip", timeoutMillis: 5000 }),
  traceResults,
);
const provider = new BasicTracerProvider({
  resource: resourceFromAttributes({ "service.name": "checkout" }),
  spanProcessors: [new BatchSpanProcessor(traceExporter, { maxExportBatchSize: 512, scheduledDelayMillis: 60_000 })],
});
const tracer = provider.getTracer("ursula-otel-daily-test", "1.0.0");
for (const name of ["GET /cart", "SELECT cart_items", "render"]) tracer.startSpan(name).end();
await provider.forceFlush();
for (const name of ["POST /checkout", "charge card"]) tracer.startSpan(name).end();
await provider.forceFlush();
await provider.shutdown();
equal(traceResults, ["ok", "ok"], "trace exporter results");

// ---- logs: one batch of three records, the stream's first and only write.
const logResults = [];
const logExporter = recorded(new OTLPLogExporter({ url: logsUrl, compression: "gzip", timeoutMillis: 5000 }), logResults);
const loggerProvider = new LoggerProvider({
  resource: resourceFromAttributes({ "service.name": "checkout" }),
  processors: [new BatchLogRecordProcessor(logExporter, { scheduledDelayMillis: 60_000 })],
});
const logger = loggerProvider.getLogger("ursula-otel-daily-test");
for (const [severityText, body] of [["INFO", "cart loaded"], ["WARN", "slow payment"], ["ERROR", "payment declined"]]) {
  logger.emit({ severityText, body });
}
await loggerProvider.forceFlush();
await loggerProvider.shutdown();
equal(logResults, ["ok"], "log exporter results");

// Each stream exists now, with the bucket's content type and TTL.
for (const url of [tracesUrl, logsUrl]) {
  const h = await http("HEAD", url, { status: 200 });
  equal(h.headers.get("content-type"), "application/json", `${url} content type`);
  equal(h.headers.get("stream-ttl"), TTL, `${url} TTL`);
}
const listing = JSON.parse((await http("GET", `${URSULA}/${BUCKET}/streams`, { status: 200 })).text);
equal(listing.stream_count, 2, `streams in ${BUCKET}: ${JSON.stringify(listing)}`);

// Every export request is one record, in order, holding what was exported.
const messages = async (url) => (await http("GET", `${url}?offset=-1`, { status: 200 })).text.split("\n").filter(Boolean);
const traces = await messages(tracesUrl);
equal(traces.length, 2, "trace export requests stored as records");
const spanNames = (msg) =>
  JSON.parse(msg).resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans.map((s) => s.name)));
equal(spanNames(traces[0]), ["GET /cart", "SELECT cart_items", "render"], "first trace export");
equal(spanNames(traces[1]), ["POST /checkout", "charge card"], "second trace export");
const service = JSON.parse(traces[0]).resourceSpans[0].resource.attributes.find((a) => a.key === "service.name");
equal(service?.value?.stringValue, "checkout", "resource service.name");

const logs = await messages(logsUrl);
equal(logs.length, 1, "log export requests stored as records");
const records = JSON.parse(logs[0]).resourceLogs[0].scopeLogs[0].logRecords;
equal(
  records.map((r) => [r.severityText, r.body.stringValue]),
  [["INFO", "cart loaded"], ["WARN", "slow payment"], ["ERROR", "payment declined"]],
  "log records",
);
check(records.every((r) => BigInt(r.timeUnixNano) > 0n), "every log record has its time");
console.log(`otel daily streams: ok (gzip exports created ${BUCKET}/traces-checkout-${day} and logs-checkout-${day})`);
