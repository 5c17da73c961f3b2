"""The PyPI client `durable-streams` (pinned in requirements.txt), unmodified, against
Ursula's compat surface: create, append, read, tail (long-poll and SSE), close, delete.

Env: URSULA_URL. Any mismatch raises, so the process exits non-zero.

durable-streams 0.1.0 has no operation that closes a stream (its `close()` releases the
HTTP client), so the close test closes the stream with a plain protocol request and
checks what the client then sees.
"""

import asyncio
import os
import queue
import sys
import threading
import time

import httpx
from durable_streams import (
    AsyncDurableStream,
    DurableStream,
    DurableStreamError,
    SeqConflictError,
    StreamExistsError,
    StreamNotFoundError,
    astream,
    stream,
)

BASE = os.environ["URSULA_URL"].rstrip("/") + "/v1/stream"
RUN = f"py-{int(time.time() * 1000):x}"
passed = 0


def expect_equal(actual, expected, what):
    if actual != expected:
        raise AssertionError(f"{what}:\n  expected {expected!r}\n  actual   {actual!r}")


def test(fn):
    global passed
    started = time.monotonic()
    fn(f"{BASE}/{RUN}-{fn.__name__}")
    passed += 1
    print(f"  ok {fn.__name__} ({(time.monotonic() - started) * 1000:.0f} ms)", flush=True)


def read_all_json(url):
    with stream(url, offset="-1", live=False) as res:
        return res.read_json()


@test
def json_stream(url):
    values = [{"i": i, "text": f"message {i}", "nested": {"ok": True, "list": [i, i * 2]}} for i in range(20)]
    with DurableStream.create(url, content_type="application/json") as handle:
        expect_equal(handle.content_type, "application/json", "content type")
        results = [handle.append(v) for v in values[:10]]
        # Concurrent appends: the client batches them into one JSON array request.
        threads = [threading.Thread(target=handle.append, args=(v,)) for v in values[10:]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        offsets = [r.next_offset for r in results]
        expect_equal(offsets, sorted(offsets), "append offsets increase")
        head = handle.head()
    items = read_all_json(url)
    expect_equal(items[:10], values[:10], "sequential appends in order")
    expect_equal(sorted(items[10:], key=lambda v: v["i"]), values[10:], "concurrent appends all present")
    with stream(url, offset=head.offset, live=False) as res:
        expect_equal(res.read_json(), [], "read from the tail")
        expect_equal(res.up_to_date, True, "up to date at the tail")


@test
def bytes_stream(url):
    parts = [b"hello ", "w\u00f6rld ".encode(), bytes(range(256)), b"x" * 100_000]
    with DurableStream.create(url, content_type="application/octet-stream") as handle:
        for p in parts:
            handle.append(p)
    with stream(url, offset="-1", live=False) as res:
        expect_equal(res.read_bytes(), b"".join(parts), "bytes read back")
    # Resuming from a mid-stream offset returned by the server.
    with DurableStream.connect(url) as handle:
        tail = handle.head().offset
        handle.append(b"after")
    with stream(url, offset=tail, live=False) as res:
        expect_equal(res.read_bytes(), b"after", "read from a returned offset")


def tail(url, live):
    with DurableStream.create(url, content_type="application/json") as handle:
        start = handle.head().offset
        got = queue.Queue()
        values = [{"live": live, "n": n} for n in range(3)]

        def reader():
            try:
                with stream(url, offset=start, live=live, timeout=10.0) as res:
                    seen = 0
                    for item in res.iter_json():
                        got.put(item)
                        seen += 1
                        if seen == len(values):
                            return
            except Exception as e:  # surfaced to the main thread
                got.put(e)

        t = threading.Thread(target=reader, daemon=True)
        t.start()
        time.sleep(0.2)  # let the reader reach the tail and wait
        for v in values:
            handle.append(v)
            time.sleep(0.03)
        received = []
        deadline = time.monotonic() + 10
        while len(received) < len(values):
            item = got.get(timeout=max(0.1, deadline - time.monotonic()))
            if isinstance(item, Exception):
                raise item
            received.append(item)
        t.join(timeout=5)
        expect_equal(received, values, f"{live} tail")


@test
def tail_long_poll(url):
    tail(url, "long-poll")


@test
def tail_sse(url):
    tail(url, "sse")


@test
def close(url):
    with DurableStream.create(url, content_type="application/json") as handle:
        handle.append({"before": "close"})
        r = httpx.post(url, headers={"Stream-Closed": "true", "Content-Type": "application/json"})
        expect_equal(r.status_code, 204, "close request")
        expect_equal(r.headers.get("stream-closed"), "true", "close response header")
        try:
            handle.append({"after": "close"})
        except DurableStreamError as e:
            expect_equal(getattr(e, "status", None), 409, f"append after close: {e}")
        else:
            raise AssertionError("append after close succeeded")
        head = handle.head()
        expect_equal(head.offset, r.headers["stream-next-offset"], "head offset after close")
    expect_equal(read_all_json(url), [{"before": "close"}], "closed stream still readable")


@test
def delete(url):
    with DurableStream.create(url, content_type="text/plain") as handle:
        handle.append("bye")
        handle.delete()
        try:
            handle.head()
        except StreamNotFoundError:
            pass
        else:
            raise AssertionError("head after delete succeeded")
    try:
        with stream(url, offset="-1", live=False) as res:
            res.read_bytes()
    except (StreamNotFoundError, DurableStreamError):
        pass
    else:
        raise AssertionError("read after delete succeeded")


@test
def create_options(url):
    # An initial body and a TTL; creating again with the same options is idempotent, with
    # another content type it conflicts.
    with DurableStream.create(url, content_type="application/json", ttl_seconds=3600, body=[{"first": True}]) as h:
        h.append({"second": True})
    expect_equal(read_all_json(url), [{"first": True}, {"second": True}], "initial body + append")
    DurableStream.create(url, content_type="application/json", ttl_seconds=3600).close()
    try:
        DurableStream.create(url, content_type="text/plain").close()
    except StreamExistsError:
        pass
    else:
        raise AssertionError("create with another content type succeeded")
    head = DurableStream.head_static(url)
    expect_equal(head.content_type, "application/json", "head_static content type")


@test
def seq(url):
    with DurableStream.create(url, content_type="text/plain", batching=False) as h:
        h.append("a", seq="0001")
        h.append("b", seq="0002")
        try:
            h.append("c", seq="0002")
        except SeqConflictError:
            pass
        else:
            raise AssertionError("a repeated Stream-Seq was accepted")
    with stream(url, offset="-1", live=False) as res:
        expect_equal(res.read_text(), "ab", "seq-ordered appends")


@test
def async_client(url):
    async def main():
        values = [{"async": i} for i in range(10)]
        h = await AsyncDurableStream.create(url, content_type="application/json")
        try:
            start = (await h.head()).offset
            got = []

            async def reader():
                async with astream(url, offset=start, live="sse") as res:
                    async for item in res.iter_json():
                        got.append(item)
                        if len(got) == len(values):
                            return

            task = asyncio.create_task(reader())
            await asyncio.sleep(0.2)
            await asyncio.gather(*(h.append(v) for v in values))
            await asyncio.wait_for(task, timeout=10)
            expect_equal(sorted(got, key=lambda v: v["async"]), values, "async SSE tail")
            async with astream(url, offset="-1", live=False) as res:
                stored = await res.read_json()
            expect_equal(stored, got, "async catch-up read equals the live order")
        finally:
            await h.aclose()

    asyncio.run(main())


print(f"durable-streams (Python): {passed} tests passed")
sys.exit(0)
