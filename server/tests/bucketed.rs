//! Bucketed surface (extensions §1, protocol §0.2): bucket CRUD, stream operations under a
//! missing bucket, the NDJSON read profile for JSON streams, and stream listing.

mod support;

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};

use support::{expect, offset_token, req, temp_dir, Response, Server};

fn server() -> (Server, tempfile::TempDir) {
    let dir = temp_dir("ursula-bucketed");
    let s = Server::spawn_standard(&dir.path().join("data"), "memory", 2, &[], None);
    (s, dir)
}

fn json(r: &Response) -> Value {
    assert!(
        r.header("content-type")
            .is_some_and(|v| v.starts_with("application/json")),
        "{r:?}"
    );
    sonic_rs::from_slice(&r.body).unwrap_or_else(|e| panic!("bad JSON {:?}: {e}", r.body_str()))
}

#[test]
fn bucket_create_is_201_then_409() {
    let (s, _d) = server();
    let r = expect(&s, "PUT", "/agents", &[], b"", 201);
    let loc = r.header("location").expect("Location on bucket 201");
    assert!(
        loc.starts_with("http://") && loc.ends_with("/agents"),
        "{loc}"
    );
    expect(&s, "PUT", "/agents", &[], b"", 409);

    // Invalid IDs.
    let long = format!("/{}", "a".repeat(65));
    let mut wrong = Vec::new();
    let long_s = format!("{long}/s");
    for bad in [
        "/abc",
        "/ABCD",
        "/has.dot",
        "/sp%20ce",
        long.as_str(),
        "/abc/s",
        long_s.as_str(),
    ] {
        for method in ["PUT", "GET", "DELETE"] {
            let r = req(&s, method, bad, &[], b"");
            if r.status != 400 {
                wrong.push(format!("{method} {bad} -> {} {:?}", r.status, r.body_str()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "invalid bucket IDs must be 400 invalid_bucket_id: {wrong:#?}"
    );
    // `__` prefixes are reserved for server endpoints: never creatable as a bucket.
    let r = req(&s, "PUT", "/__internal", &[], b"");
    assert!(r.status == 400 || r.status == 404, "{r:?}");
    // Boundary lengths are fine.
    expect(&s, "PUT", "/abcd", &[], b"", 201);
    expect(&s, "PUT", &format!("/{}", "z".repeat(64)), &[], b"", 201);
}

#[test]
fn stream_ops_under_missing_bucket_are_404() {
    let (s, _d) = server();
    let tp = [("Content-Type", "text/plain")];
    expect(&s, "PUT", "/nobucket/s1", &tp, b"x", 404);
    expect(&s, "POST", "/nobucket/s1", &tp, b"x", 404);
    expect(&s, "GET", "/nobucket/s1?offset=-1", &[], b"", 404);
    expect(&s, "HEAD", "/nobucket/s1", &[], b"", 404);
    expect(&s, "DELETE", "/nobucket/s1", &[], b"", 404);
    expect(&s, "GET", "/nobucket", &[], b"", 404);
    expect(&s, "GET", "/nobucket/streams", &[], b"", 404);
    expect(&s, "DELETE", "/nobucket", &[], b"", 404);
    // The failed PUT did not create the bucket.
    expect(&s, "PUT", "/nobucket", &[], b"", 201);
    expect(&s, "HEAD", "/nobucket/s1", &[], b"", 404);
}

#[test]
fn json_stream_reads_as_ndjson() {
    let (s, _d) = server();
    expect(&s, "PUT", "/telemetry", &[], b"", 201);
    let p = "/telemetry/events";
    let js = [("Content-Type", "application/json")];
    let r = expect(&s, "PUT", p, &js, b"", 201);
    assert_eq!(r.header("content-type"), Some("application/json"));

    // Empty stream: empty body, not `[]`.
    let r = expect(&s, "GET", &format!("{p}?offset=-1"), &[], b"", 200);
    assert!(
        r.body.is_empty(),
        "empty NDJSON read must be empty: {:?}",
        r.body_str()
    );
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(r.header("stream-up-to-date"), Some("true"));

    expect(
        &s,
        "POST",
        p,
        &js,
        b"[ {\"a\" : 1}, {\"b\": [1, 2], \"s\": \"x y\"} ]",
        204,
    );
    expect(&s, "POST", p, &js, b" 42 ", 204);
    let all: &[u8] = b"{\"a\":1}\n{\"b\":[1,2],\"s\":\"x y\"}\n42\n";

    let r = expect(&s, "GET", &format!("{p}?offset=-1"), &[], b"", 200);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    assert_eq!(r.body, all, "{:?}", r.body_str());
    assert_eq!(r.next_offset(), Some(all.len() as u64));

    // Byte offsets may start mid-record.
    let r = expect(&s, "GET", &format!("{p}?offset=3"), &[], b"", 200);
    assert_eq!(r.body, &all[3..]);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let r = expect(
        &s,
        "GET",
        &format!("{p}?offset={}", offset_token(10)),
        &[],
        b"",
        200,
    );
    assert_eq!(r.body, &all[10..]);

    // max_bytes may cut mid-record too.
    let r = expect(
        &s,
        "GET",
        &format!("{p}?offset=-1&max_bytes=5"),
        &[],
        b"",
        200,
    );
    assert_eq!(r.body, &all[..5]);
    assert_eq!(r.next_offset(), Some(5));
    assert_eq!(r.header("stream-up-to-date"), None);

    // At the tail and with offset=now: empty body.
    let r = expect(
        &s,
        "GET",
        &format!("{p}?offset={}", all.len()),
        &[],
        b"",
        200,
    );
    assert!(r.body.is_empty(), "{:?}", r.body_str());
    let r = expect(&s, "GET", &format!("{p}?offset=now"), &[], b"", 200);
    assert!(r.body.is_empty(), "{:?}", r.body_str());
    assert_eq!(r.next_offset(), Some(all.len() as u64));

    // HEAD keeps the stored type.
    let r = expect(&s, "HEAD", p, &[], b"", 200);
    assert_eq!(r.header("content-type"), Some("application/json"));

    // The same logical content on the compat surface is a JSON array (separate namespace).
    expect(
        &s,
        "PUT",
        "/v1/stream/telemetry/events",
        &js,
        b"[{\"a\":1}]",
        201,
    );
    let r = expect(
        &s,
        "GET",
        "/v1/stream/telemetry/events?offset=-1",
        &[],
        b"",
        200,
    );
    assert_eq!(r.body, b"[{\"a\":1}]");
    let r = expect(&s, "GET", &format!("{p}?offset=-1"), &[], b"", 200);
    assert_eq!(r.body, all);
}

#[test]
fn json_long_poll_returns_ndjson() {
    let (s, _d) = server();
    expect(&s, "PUT", "/lpbucket", &[], b"", 201);
    let p = "/lpbucket/j";
    let js = [("Content-Type", "application/json")];
    expect(&s, "PUT", p, &js, b"{\"x\":1}", 201);
    let r = expect(
        &s,
        "GET",
        &format!("{p}?offset=-1&live=long-poll"),
        &[],
        b"",
        200,
    );
    assert_eq!(r.body, b"{\"x\":1}\n");
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
}

fn ids(v: &Value) -> Vec<String> {
    v["streams"]
        .as_array()
        .expect("streams array")
        .iter()
        .map(|e| e["stream_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn listing_is_sorted_filtered_and_paged() {
    let (s, _d) = server();
    expect(&s, "PUT", "/listing", &[], b"", 201);
    let tp = [("Content-Type", "text/plain")];
    // Created out of order; byte-wise order puts "user-10" before "user-2".
    for id in ["user-2", "other", "user-10", "user-1", "user-3", "Zed"] {
        expect(&s, "PUT", &format!("/listing/{id}"), &tp, b"", 201);
    }
    expect(&s, "POST", "/listing/user-1", &tp, b"0123456789", 204);
    expect(
        &s,
        "POST",
        "/listing/user-3",
        &[("Stream-Closed", "true")],
        b"",
        204,
    );

    let v = json(&expect(&s, "GET", "/listing/streams", &[], b"", 200));
    assert_eq!(v["bucket_id"].as_str(), Some("listing"));
    assert!(v["prefix"].is_null(), "{v:?}");
    assert_eq!(
        ids(&v),
        ["Zed", "other", "user-1", "user-10", "user-2", "user-3"]
    );
    assert_eq!(v["stream_count"].as_u64(), Some(6));
    assert_eq!(v["has_more"].as_bool(), Some(false));
    assert!(v["next_cursor"].is_null());
    let streams = v["streams"].as_array().unwrap();
    let u1 = &streams[2];
    assert_eq!(u1["status"].as_str(), Some("Open"));
    assert_eq!(u1["content_type"].as_str(), Some("text/plain"));
    assert_eq!(u1["tail_offset"].as_str(), Some(offset_token(10).as_str()));
    assert!(u1["created_at_ms"].as_u64().is_some());
    assert!(u1["last_write_at_ms"].as_u64().is_some());
    assert_eq!(streams[5]["status"].as_str(), Some("Closed"));

    // Prefix.
    let v = json(&expect(
        &s,
        "GET",
        "/listing/streams?prefix=user-",
        &[],
        b"",
        200,
    ));
    assert_eq!(v["prefix"].as_str(), Some("user-"));
    assert_eq!(ids(&v), ["user-1", "user-10", "user-2", "user-3"]);

    // Paging with limit=2 through the prefix.
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &after {
            Some(a) => format!("/listing/streams?prefix=user-&limit=2&after={a}"),
            None => "/listing/streams?prefix=user-&limit=2".to_string(),
        };
        let v = json(&expect(&s, "GET", &q, &[], b"", 200));
        pages += 1;
        let page = ids(&v);
        assert!(page.len() <= 2);
        assert_eq!(v["stream_count"].as_u64(), Some(page.len() as u64));
        got.extend(page.iter().cloned());
        if v["has_more"].as_bool() == Some(true) {
            let cur = v["next_cursor"].as_str().expect("next_cursor").to_string();
            assert_eq!(Some(&cur), page.last());
            after = Some(cur);
        } else {
            assert!(v["next_cursor"].is_null(), "{v:?}");
            break;
        }
        assert!(pages < 10);
    }
    assert_eq!(got, ["user-1", "user-10", "user-2", "user-3"]);
    assert_eq!(
        pages, 2,
        "4 entries with limit 2 and exact has_more: 2 pages"
    );

    // `after` alone is exclusive.
    let v = json(&expect(
        &s,
        "GET",
        "/listing/streams?after=user-10",
        &[],
        b"",
        200,
    ));
    assert_eq!(ids(&v), ["user-2", "user-3"]);

    // Bad limits.
    for bad in ["0", "1001", "-1", "abc", ""] {
        expect(
            &s,
            "GET",
            &format!("/listing/streams?limit={bad}"),
            &[],
            b"",
            400,
        );
    }
    expect(&s, "GET", "/listing/streams?limit=1000", &[], b"", 200);
    // Only GET on the listing endpoint.
    expect(&s, "PUT", "/listing/streams", &tp, b"", 405);
    expect(&s, "POST", "/listing/streams", &tp, b"x", 405);

    // Deleted streams disappear from the listing.
    expect(&s, "DELETE", "/listing/other", &[], b"", 204);
    let v = json(&expect(&s, "GET", "/listing/streams", &[], b"", 200));
    assert_eq!(ids(&v), ["Zed", "user-1", "user-10", "user-2", "user-3"]);
}

/// The `bucket_id`s of a bucket listing page, with each bucket's stream count.
fn bucket_counts(v: &Value) -> Vec<(String, u64)> {
    v["buckets"]
        .as_array()
        .expect("buckets array")
        .iter()
        .map(|b| {
            let id = b["bucket_id"].as_str().expect("bucket_id").to_string();
            (id, b["streams"].as_u64().expect("streams"))
        })
        .collect()
}

#[test]
fn bucket_listing_counts_live_streams_and_pages() {
    // Four cores, so the buckets' owners and their streams are spread over several shards.
    let dir = temp_dir("ursula-bucket-list");
    let s = Server::spawn_standard(&dir.path().join("data"), "memory", 4, &[], None);
    let v = json(&expect(&s, "GET", "/", &[], b"", 200));
    assert_eq!(bucket_counts(&v), Vec::<(String, u64)>::new());
    assert_eq!(v["has_more"].as_bool(), Some(false));

    let tp = [("Content-Type", "text/plain")];
    for bucket in ["logs-b", "logs-a", "metrics", "audit"] {
        expect(&s, "PUT", &format!("/{bucket}"), &[], b"", 201);
    }
    for stream in ["s1", "s2", "s3", "s4", "s5"] {
        expect(&s, "PUT", &format!("/logs-a/{stream}"), &tp, b"", 201);
    }
    expect(&s, "PUT", "/metrics/cpu", &tp, b"", 201);
    // A stream on the compat surface belongs to no bucket.
    expect(&s, "PUT", "/v1/stream/logs-a/x", &tp, b"", 201);

    let v = json(&expect(&s, "GET", "/", &[], b"", 200));
    let want = [("audit", 0), ("logs-a", 5), ("logs-b", 0), ("metrics", 1)];
    let want: Vec<(String, u64)> = want.iter().map(|(b, n)| (b.to_string(), *n)).collect();
    assert_eq!(bucket_counts(&v), want);
    assert_eq!(v["bucket_count"].as_u64(), Some(4));
    assert!(v["prefix"].is_null() && v["next_cursor"].is_null(), "{v:?}");
    // Each count is the one `GET /{bucket}` gives.
    let meta = json(&expect(&s, "GET", "/logs-a", &[], b"", 200));
    assert_eq!(meta["streams"].as_u64(), Some(5));

    // Paged by prefix, two at a time: the cursor is the last ID of a page.
    let v = json(&expect(&s, "GET", "/?prefix=logs-&limit=1", &[], b"", 200));
    assert_eq!(bucket_counts(&v), [("logs-a".to_string(), 5)]);
    assert_eq!(v["prefix"].as_str(), Some("logs-"));
    assert_eq!(v["has_more"].as_bool(), Some(true));
    assert_eq!(v["next_cursor"].as_str(), Some("logs-a"));
    let v = json(&expect(
        &s,
        "GET",
        "/?prefix=logs-&limit=1&after=logs-a",
        &[],
        b"",
        200,
    ));
    assert_eq!(bucket_counts(&v), [("logs-b".to_string(), 0)]);
    assert_eq!(v["has_more"].as_bool(), Some(false));
    assert!(v["next_cursor"].is_null(), "{v:?}");

    // Deleted streams and buckets leave the listing.
    expect(&s, "DELETE", "/logs-a/s1", &[], b"", 204);
    expect(&s, "DELETE", "/audit", &[], b"", 204);
    let v = json(&expect(&s, "GET", "/", &[], b"", 200));
    let ids: Vec<(String, u64)> = bucket_counts(&v);
    assert_eq!(
        ids,
        [
            ("logs-a".to_string(), 4),
            ("logs-b".to_string(), 0),
            ("metrics".to_string(), 1)
        ]
    );

    // The listing's parameters are checked like a stream listing's; only GET lists.
    for bad in [
        "limit=0",
        "limit=1001",
        "limit=x",
        "limit=1&limit=2",
        "prefix=%zz",
    ] {
        let r = expect(&s, "GET", &format!("/?{bad}"), &[], b"", 400);
        assert!(
            r.body_str().starts_with("invalid_request: "),
            "{bad}: {r:?}"
        );
    }
    let r = expect(&s, "PUT", "/", &tp, b"", 405);
    assert_eq!(r.header("allow"), Some("GET"));
    expect(&s, "DELETE", "/", &[], b"", 405);
}

#[test]
fn bucket_metadata_and_delete() {
    let (s, _d) = server();
    expect(&s, "PUT", "/meta", &[], b"", 201);
    let v = json(&expect(&s, "GET", "/meta", &[], b"", 200));
    assert_eq!(v["bucket_id"].as_str(), Some("meta"));
    assert_eq!(v["streams"].as_u64(), Some(0));

    let tp = [("Content-Type", "text/plain")];
    expect(&s, "PUT", "/meta/a", &tp, b"", 201);
    expect(&s, "PUT", "/meta/b", &tp, b"", 201);
    let v = json(&expect(&s, "GET", "/meta", &[], b"", 200));
    assert_eq!(v["streams"].as_u64(), Some(2));

    expect(&s, "DELETE", "/meta", &[], b"", 409);
    // Still there with its streams.
    expect(&s, "HEAD", "/meta/a", &[], b"", 200);
    expect(&s, "DELETE", "/meta/a", &[], b"", 204);
    let v = json(&expect(&s, "GET", "/meta", &[], b"", 200));
    assert_eq!(v["streams"].as_u64(), Some(1));
    expect(&s, "DELETE", "/meta", &[], b"", 409);
    expect(&s, "DELETE", "/meta/b", &[], b"", 204);
    expect(&s, "DELETE", "/meta", &[], b"", 204);
    expect(&s, "GET", "/meta", &[], b"", 404);
    expect(&s, "DELETE", "/meta", &[], b"", 404);
    expect(&s, "PUT", "/meta/a", &tp, b"", 404);
    // It can be created again, empty.
    expect(&s, "PUT", "/meta", &[], b"", 201);
    let v = json(&expect(&s, "GET", "/meta", &[], b"", 200));
    assert_eq!(v["streams"].as_u64(), Some(0));
    expect(&s, "HEAD", "/meta/b", &[], b"", 404);
}

#[test]
fn invalid_stream_ids_are_400() {
    let (s, _d) = server();
    expect(&s, "PUT", "/idcheck", &[], b"", 201);
    let tp = [("Content-Type", "text/plain")];
    // bucket "idcheck" (7) + "/" leaves 114 bytes for the stream ID.
    let ok_id = format!("/idcheck/{}", "s".repeat(114));
    expect(&s, "PUT", &ok_id, &tp, b"", 201);
    let too_long = format!("/idcheck/{}", "s".repeat(115));
    let way_too_long = format!("/idcheck/{}", "s".repeat(200));
    let mut wrong = Vec::new();
    for bad in [
        "/idcheck/a..b",
        "/idcheck/..",
        "/idcheck/a%2Fb",
        "/idcheck/a%00b",
        "/idcheck/%FF",
        too_long.as_str(),
        way_too_long.as_str(),
    ] {
        let r = req(&s, "PUT", bad, &tp, b"");
        if r.status != 400 {
            wrong.push(format!("PUT {bad} -> {}", r.status));
        }
    }
    assert!(
        wrong.is_empty(),
        "invalid stream IDs must be 400: {wrong:#?}"
    );
    let v = json(&expect(&s, "GET", "/idcheck", &[], b"", 200));
    assert_eq!(v["streams"].as_u64(), Some(1));
}
