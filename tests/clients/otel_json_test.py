"""The Python OTLP JSON exporters (opentelemetry-exporter-otlp-json-http) post into daily
streams their bucket creates on the first export (`auto_create`): traces gzip-compressed,
logs deflate-compressed. Each export request must arrive as one record holding what was
exported, and each stream must carry the bucket's content type and TTL.
Env: URSULA_URL."""

import datetime
import json
import os
import sys
import urllib.error
import urllib.request

from opentelemetry.exporter.otlp.common.http import Compression
from opentelemetry.exporter.otlp.json.http import OTLPSpanExporter
from opentelemetry.exporter.otlp.json.http._log_exporter import OTLPLogExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

URSULA = os.environ["URSULA_URL"].rstrip("/")
BUCKET = "otel-daily-py"
TTL = "86400"


def http(method, url, body=None, headers=None):
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def expect(method, url, status, body=None, headers=None):
    got, hdrs, data = http(method, url, body, headers)
    if got != status:
        sys.exit(f"{method} {url}: expected {status}, got {got}: {data!r}")
    return hdrs, data


def equal(actual, expected, what):
    if actual != expected:
        sys.exit(f"{what}:\n  expected {expected!r}\n  actual   {actual!r}")


settings = {"auto_create": {"content_type": "application/json", "ttl_seconds": int(TTL)}}
expect("PUT", f"{URSULA}/{BUCKET}", 201, json.dumps(settings).encode(), {"content-type": "application/json"})
day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
traces_url = f"{URSULA}/{BUCKET}/traces-billing-{day}"
logs_url = f"{URSULA}/{BUCKET}/logs-billing-{day}"
for url in (traces_url, logs_url):
    expect("HEAD", url, 404)

resource = Resource.create({"service.name": "billing"})

# Traces: one export request per span (SimpleSpanProcessor), gzip.
span_exporter = OTLPSpanExporter(endpoint=traces_url, compression=Compression.GZIP, timeout=5)
trace_results = []
export_spans = span_exporter.export
span_exporter.export = lambda spans: trace_results.append(export_spans(spans)) or trace_results[-1]
tracer_provider = TracerProvider(resource=resource)
tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
tracer = tracer_provider.get_tracer("ursula-otel-json-test", "1.0.0")
for name in ("invoice", "charge", "receipt"):
    with tracer.start_as_current_span(name):
        pass
tracer_provider.shutdown()
equal([r.name for r in trace_results], ["SUCCESS"] * 3, "span exporter results")

# Logs: one export request per record, deflate.
log_exporter = OTLPLogExporter(endpoint=logs_url, compression=Compression.DEFLATE, timeout=5)
log_results = []
export_logs = log_exporter.export
log_exporter.export = lambda batch: log_results.append(export_logs(batch)) or log_results[-1]
logger_provider = LoggerProvider(resource=resource)
logger_provider.add_log_record_processor(SimpleLogRecordProcessor(log_exporter))
logger = logger_provider.get_logger("ursula-otel-json-test")
for severity, body in (("INFO", "invoice sent"), ("ERROR", "card expired")):
    logger.emit(severity_text=severity, body=body)
logger_provider.shutdown()
equal([r.name for r in log_results], ["SUCCESS"] * 2, "log exporter results")

# Both streams exist now, as the bucket says.
for url in (traces_url, logs_url):
    hdrs, _ = expect("HEAD", url, 200)
    equal(hdrs.get("content-type"), "application/json", f"{url} content type")
    equal(hdrs.get("stream-ttl"), TTL, f"{url} TTL")


def records(url):
    _, data = expect("GET", f"{url}?offset=-1", 200)
    return [json.loads(line) for line in data.decode().splitlines() if line]


spans = records(traces_url)
equal(
    [[s["name"] for rs in r["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]] for r in spans],
    [["invoice"], ["charge"], ["receipt"]],
    "one record per span export, in order",
)
service = [a for a in spans[0]["resourceSpans"][0]["resource"]["attributes"] if a["key"] == "service.name"]
equal(service[0]["value"], {"stringValue": "billing"}, "resource service.name")
logs = records(logs_url)
equal(
    [
        (lr["severityText"], lr["body"]["stringValue"])
        for r in logs
        for rl in r["resourceLogs"]
        for sl in rl["scopeLogs"]
        for lr in sl["logRecords"]
    ],
    [("INFO", "invoice sent"), ("ERROR", "card expired")],
    "one record per log export, in order",
)
print(f"python otlp json: ok (gzip traces and deflate logs created {BUCKET}/traces-billing-{day} and logs-billing-{day})")
