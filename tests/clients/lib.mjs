// Tiny assertion helpers shared by the client tests: every failure throws, so the
// process exits non-zero with the message.
import { isDeepStrictEqual, inspect } from "node:util";

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v.replace(/\/$/, "");
}

export function check(cond, message) {
  if (!cond) throw new Error(`check failed: ${message}`);
}

export function equal(actual, expected, message) {
  if (!isDeepStrictEqual(actual, expected)) {
    throw new Error(`${message}:\n  expected ${inspect(expected, { depth: 6 })}\n  actual   ${inspect(actual, { depth: 6 })}`);
  }
}

// Polls `probe` until it returns true; on timeout throws with `describe()`'s last answer.
export async function eventually(probe, what, describe, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    let err = null;
    try {
      if (await probe()) return;
    } catch (e) {
      err = e;
    }
    if (Date.now() > deadline) {
      const last = err ? `error ${err.message}` : await describe();
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${last}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

// One HTTP request; the body read as text. With `status` (one or a list), any other status
// throws with the server's answer.
export async function http(method, url, { body, headers = {}, status } = {}) {
  const r = await fetch(url, { method, body, headers });
  const text = await r.text();
  if (status !== undefined && !(Array.isArray(status) ? status : [status]).includes(r.status)) {
    throw new Error(`${method} ${url}: expected ${status}, got ${r.status} ${text}`);
  }
  return { status: r.status, headers: r.headers, text };
}
