// Checks what a running syslog-ng `http()` destination posted: every line of INPUT_FILE is
// one record of STREAM_URL, in order, as the destination's `format-json` template made it,
// and the lines came in batches (fewer requests than lines).
// Env: URSULA_URL, STREAM_URL, INPUT_FILE, LINES, APPENDS_BEFORE (the server's count of
// POSTs to bucketed streams before syslog-ng started).
import { readFileSync } from "node:fs";
import { check, env, equal, eventually } from "./lib.mjs";

const URSULA = env("URSULA_URL");
const STREAM = env("STREAM_URL");
const lines = readFileSync(env("INPUT_FILE"), "utf8").split("\n").filter(Boolean);
equal(lines.length, Number(env("LINES")), "lines written for syslog-ng");

const head = async () => {
  const r = await fetch(STREAM, { method: "HEAD" });
  return r.ok ? Number(r.headers.get("stream-record-next")) : 0;
};
await eventually(async () => (await head()) >= lines.length, `${lines.length} records`, async () => `${await head()} records`, 30_000);
// Nothing more arrives (no duplicates from retries).
await new Promise((r) => setTimeout(r, 500));
equal(await head(), lines.length, "records in the stream");

const r = await fetch(`${STREAM}?offset=-1`);
check(r.ok, `read: ${r.status}`);
const records = (await r.text()).split("\n").filter(Boolean).map((l) => JSON.parse(l));
equal(records.length, lines.length, "records read");
records.forEach((rec, i) => {
  equal(rec, { message: lines[i], program: "shipper" }, `record ${i}`);
});

// The destination batched: the server answered fewer POSTs than there were lines.
const metrics = await (await fetch(`${URSULA}/__ursula/metrics`)).text();
const posts = appendPosts(metrics);
const requests = posts - Number(env("APPENDS_BEFORE"));
check(requests >= 1 && requests < lines.length / 4, `${requests} append requests for ${lines.length} lines`);
console.log(`syslog-ng http(): ok (${lines.length} lines in ${requests} NDJSON requests)`);

// The count of answered POSTs to bucketed streams (`route="stream"`).
function appendPosts(text) {
  let n = 0;
  for (const line of text.split("\n")) {
    if (line.startsWith("ursula_http_requests_total{") && line.includes('route="stream"') && line.includes('method="POST"')) {
      n += Number(line.split(" ").pop());
    }
  }
  return n;
}
