//! Hosts of a cluster (`--cluster`) sharing one archive in a real S3 server
//! (`ursula-test-s3`): lanes owned through their manifests, refused with 421 where they
//! are not served, and moved between hosts by release and adopt with everything they
//! acknowledged, their offsets, incarnations and producer state.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait};
use support::s3::{BUCKET, CREDS, S3};
use support::{expect, req, temp_dir, write_config, Server};

const OCTETS: (&str, &str) = ("content-type", "application/octet-stream");
const LANES: u32 = 4;
/// Lanes move only when the test says so.
const MANUAL: &[&str] = &["--cluster-assign", "manual"];

/// A host of a cluster of `lanes` lanes: its own data dir, advertising the address it
/// listens on.
fn host(dir: &Path, name: &str, config: &str, lanes: u32, extra: &[&str]) -> Server {
    let data = dir.join(name);
    let lanes = lanes.to_string();
    let mut args = support::server_args(
        &data,
        "disk",
        2,
        &["--config", config, "--cluster", "--lanes", &lanes],
    );
    // A fixed port, so that the host can advertise it.
    let listen = match args[2].as_str() {
        "127.0.0.1:0" => {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("probe a port");
            probe.local_addr().expect("probed").to_string()
        }
        fixed => fixed.to_string(),
    };
    args[2] = listen.clone();
    args.extend(["--advertise".to_string(), listen]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let log = dir.join(format!("{name}.log"));
    Server::spawn_with_env(&args, &CREDS, Some(&log), Duration::from_secs(60))
}

/// The hosts' config: `top` lines, then the cold tier archiving every `interval_ms`.
fn config(dir: &Path, s3: &S3, top: &str, interval_ms: u64) -> String {
    write_config(
        dir,
        &format!(
            "{top}[cold_tier]\ns3_bucket = \"{BUCKET}\"\ns3_prefix = \"cluster\"\n\
             s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\narchive_interval_ms = {interval_ms}\n\
             grace_ms = 600000\n",
            s3.endpoint()
        ),
    )
}

fn adopt(s: &Server, lane: u32) -> sonic_rs::Value {
    adopt_as(s, lane, &[])
}

/// [`adopt`], with these request headers (a token).
fn adopt_as(s: &Server, lane: u32, headers: &[(&str, &str)]) -> sonic_rs::Value {
    let r = expect(
        s,
        "POST",
        &format!("/__ursula/lanes/{lane}/adopt"),
        headers,
        b"",
        200,
    );
    sonic_rs::from_slice(&r.body).expect("adoption report")
}

fn release(s: &Server, lane: u32) -> sonic_rs::Value {
    let r = expect(
        s,
        "POST",
        &format!("/__ursula/lanes/{lane}/release"),
        &[],
        b"",
        200,
    );
    sonic_rs::from_slice(&r.body).expect("release report")
}

/// The lane a host that serves nothing names for `path`.
fn lane_of(empty: &Server, path: &str) -> u32 {
    let r = req(empty, "HEAD", path, &[], b"");
    assert_eq!(r.status, 421, "HEAD {path} on a host without lanes: {r:?}");
    r.header("ursula-lane")
        .and_then(|l| l.parse().ok())
        .unwrap_or_else(|| panic!("421 names the lane: {r:?}"))
}

/// A 421 naming `owner`, once the refusing host has noticed it no longer serves the lane
/// (a host that lost a lane to a forced takeover notices at its next archive commit) and
/// has looked the owner up.
fn refused_naming(s: &Server, path: &str, owner: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = req(s, "GET", path, &[], b"");
        if r.status == 421 && r.header("ursula-lane-owner") == Some(owner) {
            assert!(r.body_str().contains(owner), "{}", r.body_str());
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: the refusal never named {owner}: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn body(i: usize, n: usize) -> Vec<u8> {
    (0..n).map(|j| b'a' + ((i * 7 + j) % 26) as u8).collect()
}

/// HEAD's identity of a stream: next offset and incarnation.
fn identity(s: &Server, path: &str) -> (Option<String>, Option<String>) {
    let r = expect(s, "HEAD", path, &[], b"", 200);
    (
        r.header("stream-next-offset").map(str::to_string),
        r.header("stream-incarnation").map(str::to_string),
    )
}

#[test]
fn a_lane_moves_between_hosts_with_everything_it_acknowledged() {
    let dir = temp_dir("ursula-cluster-move");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, "", 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    let b = host(dir.path(), "b", &config, LANES, MANUAL);

    // A new cluster: nobody serves anything until lanes are adopted.
    let r = expect(&a, "GET", "/__ursula/readyz", &[], b"", 200);
    assert_eq!(
        r.body_str(),
        "ready\n",
        "a host that owns nothing yet is ready"
    );
    for lane in 0..LANES {
        let report = adopt(&a, lane);
        assert_eq!(report["epoch"].as_u64(), Some(1), "{report:?}");
    }
    let again = req(&a, "POST", "/__ursula/lanes/0/adopt", &[], b"");
    assert_eq!(again.status, 409, "{again:?}");

    // Streams on every lane, one of them with a producer.
    let producer = |seq: &'static str| {
        [
            OCTETS,
            ("producer-id", "p"),
            ("producer-epoch", "0"),
            ("producer-seq", seq),
        ]
    };
    let mut want = Vec::new();
    for i in 0..16 {
        let path = format!("/v1/stream/s-{i}");
        expect(&a, "PUT", &path, &[OCTETS], &body(i, 100), 201);
        expect(&a, "POST", &path, &[OCTETS], &body(i + 1, 50 + i), 204);
        want.push((path, [body(i, 100), body(i + 1, 50 + i)].concat()));
    }
    let moved = lane_of(&b, &want[0].0);
    expect(&a, "POST", &want[0].0, &producer("0"), b"P0", 200);
    want[0].1.extend_from_slice(b"P0");
    let before: Vec<_> = want.iter().map(|(p, _)| identity(&a, p)).collect();
    refused_naming(&b, &want[0].0, &a.addr);

    // B may not take a lane A holds and heartbeats.
    let taken = req(
        &b,
        "POST",
        &format!("/__ursula/lanes/{moved}/adopt"),
        &[],
        b"",
    );
    assert_eq!(taken.status, 409, "{taken:?} {}", taken.body_str());
    assert!(
        taken.body_str().contains("owned by"),
        "{}",
        taken.body_str()
    );

    // The planned move: A releases, B adopts.
    let started = Instant::now();
    let released = release(&a, moved);
    let adopted = adopt(&b, moved);
    let unavailable = started.elapsed();
    eprintln!("lane {moved} moved in {unavailable:?}: {released:?} {adopted:?}");
    assert_eq!(adopted["epoch"].as_u64(), Some(2), "{adopted:?}");
    assert!(!dir.path().join("a").join(format!("shard-{moved}")).exists());

    let mut on_b = 0;
    for ((path, bytes), before) in want.iter().zip(&before) {
        let lane = lane_of_refused_or_served(&a, &b, path);
        let (serving, other) = if lane == moved { (&b, &a) } else { (&a, &b) };
        on_b += usize::from(lane == moved);
        let r = expect(serving, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
        assert_eq!(&r.body, bytes, "{path} on its lane's host");
        assert_eq!(
            &identity(serving, path),
            before,
            "{path}: offsets and incarnation"
        );
        let refused = req(other, "GET", path, &[], b"");
        assert_eq!(refused.status, 421, "{path} on the other host: {refused:?}");
    }
    assert!(on_b >= 1);
    refused_naming(&a, &want[0].0, &b.addr);
    // The producer's retry after the move is a duplicate; its next append is new.
    let dup = expect(&b, "POST", &want[0].0, &producer("0"), b"P0", 204);
    assert_eq!(dup.header("producer-seq"), Some("0"));
    expect(&b, "POST", &want[0].0, &producer("1"), b"P1", 200);

    // The moves in each host's metrics.
    let metric = |s: &Server, line: &str| {
        let r = expect(s, "GET", "/__ursula/metrics", &[], b"", 200);
        assert!(
            r.body_str().lines().any(|l| l == line),
            "no `{line}` in the metrics"
        );
    };
    metric(&a, "ursula_cluster_lane_moves_total{kind=\"released\"} 1");
    metric(&a, "ursula_cluster_lane_moves_total{kind=\"adopted\"} 4");
    metric(&b, "ursula_cluster_lane_moves_total{kind=\"adopted\"} 1");
    metric(&b, "ursula_cluster_lanes{state=\"served\"} 1");
    metric(
        &a,
        &format!("ursula_cluster_lanes{{state=\"served\"}} {}", LANES - 1),
    );

    // Each host's lane view.
    let view = |s: &Server| -> sonic_rs::Value {
        let r = expect(s, "GET", "/__ursula/lanes", &[], b"", 200);
        sonic_rs::from_slice(&r.body).expect("lanes")
    };
    let lanes_a = view(&a);
    let lanes_b = view(&b);
    for lane in 0..LANES as usize {
        let (sa, sb) = (
            lanes_a["lanes"][lane]["state"].as_str().map(str::to_string),
            lanes_b["lanes"][lane]["state"].as_str().map(str::to_string),
        );
        if lane as u32 == moved {
            assert_eq!(
                (sa.as_deref(), sb.as_deref()),
                (Some("elsewhere"), Some("served"))
            );
            assert_eq!(
                lanes_b["lanes"][lane]["archive"]["address"].as_str(),
                Some(b.addr.as_str())
            );
        } else {
            assert_eq!(
                (sa.as_deref(), sb.as_deref()),
                (Some("served"), Some("elsewhere"))
            );
        }
    }

    // A restart serves the lanes the host still owns, and only those (with manual moves a
    // clean stop keeps them).
    let a_addr = a.addr.clone();
    let status = a.sigterm(Duration::from_secs(30)).expect("clean stop");
    assert!(status.success(), "{status:?}");
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    assert_ne!(a.addr, a_addr);
    for (path, bytes) in &want {
        if lane_of_refused_or_served(&a, &b, path) != moved {
            let r = expect(&a, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
            assert_eq!(&r.body, bytes, "{path} after A's restart");
        }
    }
    let r = req(&a, "GET", &want[0].0, &[], b"");
    assert_eq!(r.status, 421, "{r:?}");
}

/// The lane of `path`, from whichever of the two hosts refuses it.
fn lane_of_refused_or_served(a: &Server, b: &Server, path: &str) -> u32 {
    for s in [a, b] {
        let r = req(s, "HEAD", path, &[], b"");
        if r.status == 421 {
            let lane: u32 = r
                .header("ursula-lane")
                .and_then(|l| l.parse().ok())
                .expect("421 names the lane");
            return lane;
        }
    }
    panic!("{path}: neither host refuses it");
}

#[test]
fn a_lane_taken_over_by_force_stops_on_its_old_host_and_acknowledges_nothing_more() {
    let dir = temp_dir("ursula-cluster-force");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, "durability = \"s3\"\n", 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    let b = host(dir.path(), "b", &config, LANES, MANUAL);
    for lane in 0..LANES {
        adopt(&a, lane);
    }
    let path = "/v1/stream/zombie";
    let lane = lane_of(&b, path);
    // A stream of another lane, which A keeps serving throughout.
    let other = (0..)
        .map(|i| format!("/v1/stream/bystander-{i}"))
        .find(|p| lane_of(&b, p) != lane)
        .expect("some stream is in another lane");
    expect(&a, "PUT", &other, &[OCTETS], b"o0;", 201);
    expect(&a, "PUT", path, &[OCTETS], b"first;", 201);
    let mut acknowledged = b"first;".to_vec();
    for i in 0..5 {
        let chunk = format!("a{i};");
        expect(&a, "POST", path, &[OCTETS], chunk.as_bytes(), 204);
        acknowledged.extend_from_slice(chunk.as_bytes());
    }
    // B takes the lane while A still serves it.
    let r = expect(
        &b,
        "POST",
        &format!("/__ursula/lanes/{lane}/adopt?force=1"),
        &[],
        b"",
        200,
    );
    let report: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("report");
    assert_eq!(report["epoch"].as_u64(), Some(2), "{report:?}");
    // Whatever A answers from now on, it acknowledges nothing: its WAL is fenced.
    for i in 0..5 {
        let r = req(&a, "POST", path, &[OCTETS], format!("z{i};").as_bytes());
        assert!(
            !r.is_success(),
            "the fenced host acknowledged an append: {r:?}"
        );
    }
    // It notices, stops serving the lane, and names the new owner; its other lanes go on
    // acknowledging.
    refused_naming(&a, path, &b.addr);
    expect(&a, "POST", &other, &[OCTETS], b"o1;", 204);
    let r = expect(&a, "GET", &format!("{other}?offset=-1"), &[], b"", 200);
    assert_eq!(r.body, b"o0;o1;");
    let r = expect(&b, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
    assert_eq!(
        r.body, acknowledged,
        "everything A acknowledged, nothing else"
    );
    expect(&b, "POST", path, &[OCTETS], b"b0;", 204);
    let lanes = expect(&a, "GET", "/__ursula/lanes", &[], b"", 200);
    let lanes: sonic_rs::Value = sonic_rs::from_slice(&lanes.body).expect("lanes");
    let served: Vec<u32> = lanes["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .filter(|l| l["state"].as_str() == Some("served"))
        .filter_map(|l| l["lane"].as_u64().map(|n| n as u32))
        .collect();
    assert!(!served.contains(&lane), "{served:?}");
    assert_eq!(served.len(), LANES as usize - 1, "{lanes:?}");
}

/// The lanes a host says it serves.
fn served(s: &Server) -> Vec<u32> {
    let r = expect(s, "GET", "/__ursula/lanes", &[], b"", 200);
    let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("lanes");
    v["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .filter(|l| l["state"].as_str() == Some("served"))
        .filter_map(|l| l["lane"].as_u64().map(|n| n as u32))
        .collect()
}

/// Wait until `done` holds, or fail naming `what`; returns how long it took.
fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// A request sent to `first`, following 421s to the owner they name (among `hosts`) and
/// retrying 503s, as a client of the cluster would.
fn cluster_req(
    hosts: &[&Server],
    first: usize,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> support::Response {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut at = first;
    loop {
        let r = req(hosts[at], method, path, headers, body);
        let owner = r.header("ursula-lane-owner").map(str::to_string);
        let next = owner.and_then(|o| hosts.iter().position(|h| h.addr == o));
        match (r.status, next) {
            (421, Some(n)) if n != at => at = n,
            (421 | 503, _) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            _ => return r,
        }
    }
}

/// Lanes of the automatically assigned cluster: enough that two hosts both get some.
const AUTO_LANES: u32 = 16;

#[test]
fn hosts_share_the_lanes_and_take_over_a_lost_or_leaving_hosts_lanes() {
    let dir = temp_dir("ursula-cluster-auto");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(
        dir.path(),
        &s3,
        "durability = \"s3\"\ncluster_heartbeat_ms = 250\ncluster_lease_ms = 2500\n",
        1000,
    );
    let lanes = AUTO_LANES;
    let a = host(dir.path(), "a", &config, AUTO_LANES, &[]);
    wait_for(
        "a lone host takes every lane",
        Duration::from_secs(20),
        || served(&a).len() == lanes as usize,
    );
    let b = host(dir.path(), "b", &config, AUTO_LANES, &[]);
    wait_for("two hosts share the lanes", Duration::from_secs(20), || {
        let (sa, sb) = (served(&a), served(&b));
        !sb.is_empty() && sa.len() + sb.len() == lanes as usize
    });

    // Streams on every lane, written through whichever host the client reaches first.
    let mut want = Vec::new();
    for i in 0..40 {
        let path = format!("/v1/stream/auto-{i}");
        let hosts = [&a, &b];
        let r = cluster_req(&hosts, i % 2, "PUT", &path, &[OCTETS], &body(i, 64));
        assert_eq!(r.status, 201, "{path}: {r:?}");
        let r = cluster_req(
            &hosts,
            i % 2,
            "POST",
            &path,
            &[OCTETS],
            &body(i + 3, 10 + i),
        );
        assert_eq!(r.status, 204, "{path}: {r:?}");
        want.push((path, [body(i, 64), body(i + 3, 10 + i)].concat()));
    }

    // B is lost with its disk: A adopts its lanes, with everything B acknowledged.
    let lost = served(&b);
    b.kill9();
    std::fs::remove_dir_all(dir.path().join("b")).expect("lose b's disk");
    let failover = wait_for(
        "a adopts the lost host's lanes",
        Duration::from_secs(30),
        || served(&a).len() == lanes as usize,
    );
    eprintln!(
        "{} lanes of a killed host writable again after {failover:?}",
        lost.len()
    );
    for (path, bytes) in &want {
        let r = expect(&a, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
        assert_eq!(&r.body, bytes, "{path} after the failover");
    }

    // A new host takes its share; when it stops cleanly it gives the lanes back first.
    let c = host(dir.path(), "c", &config, AUTO_LANES, &[]);
    wait_for(
        "the new host takes its share",
        Duration::from_secs(20),
        || {
            let (sa, sc) = (served(&a), served(&c));
            !sc.is_empty() && sa.len() + sc.len() == lanes as usize
        },
    );
    for (i, (path, bytes)) in want.iter_mut().enumerate() {
        let extra = format!("c{i};");
        let hosts = [&a, &c];
        let r = cluster_req(&hosts, 1, "POST", path, &[OCTETS], extra.as_bytes());
        assert_eq!(r.status, 204, "{path}: {r:?}");
        bytes.extend_from_slice(extra.as_bytes());
    }
    let started = Instant::now();
    let status = c.sigterm(Duration::from_secs(60)).expect("a clean stop");
    assert!(status.success(), "{status:?}");
    let stop = started.elapsed();
    let back = wait_for(
        "the leaving host's lanes come back",
        Duration::from_secs(20),
        || served(&a).len() == lanes as usize,
    );
    eprintln!("a leaving host stopped in {stop:?}; its lanes served again {back:?} later");
    for (path, bytes) in &want {
        let r = expect(&a, "GET", &format!("{path}?offset=-1"), &[], b"", 200);
        assert_eq!(&r.body, bytes, "{path} after the host left");
    }
}

/// A fork on one host of a stream on a lane another host owns: the fork's host takes the
/// source's history from its owner (presenting the cluster token, since the hosts check
/// tokens), the source keeps a reference while the fork lives, and the fork's removal
/// gives it back.
#[test]
fn a_fork_takes_its_source_from_the_host_that_owns_it() {
    let dir = temp_dir("ursula-cluster-fork");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let token = "write-token-of-the-cluster-0123";
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("write:{token}\n")).expect("token file");
    let cluster_token = dir.path().join("cluster-token");
    std::fs::write(&cluster_token, format!("{token}\n")).expect("cluster token file");
    let top = format!(
        "auth_token_file = \"{}\"\ncluster_token_file = \"{}\"\n",
        tokens.display(),
        cluster_token.display()
    );
    let config = config(dir.path(), &s3, &top, 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    let b = host(dir.path(), "b", &config, LANES, MANUAL);
    let bearer = format!("Bearer {token}");
    let auth = ("authorization", bearer.as_str());
    let lane = |name: &str| {
        let r = req(&a, "HEAD", name, &[auth], b"");
        assert_eq!(r.status, 421, "{r:?}");
        r.header("ursula-lane")
            .and_then(|l| l.parse::<u32>().ok())
            .expect("421 names the lane")
    };
    // A source on A's lanes (0 and 1), forks on B's (2 and 3).
    let pick = |prefix: &str, on: &[u32]| {
        (0..)
            .map(|i| format!("/v1/stream/{prefix}-{i}"))
            .find(|p| on.contains(&lane(p)))
            .expect("a name on those lanes")
    };
    let source = pick("source", &[0, 1]);
    let fork = pick("fork", &[2, 3]);
    let orphan = pick("orphan", &[2, 3]);
    let missing = pick("missing", &[0, 1]);
    for l in [0, 1] {
        adopt_as(&a, l, &[auth]);
    }
    for l in [2, 3] {
        adopt_as(&b, l, &[auth]);
    }

    let json = ("content-type", "application/json");
    expect(&a, "PUT", &source, &[auth, json], b"", 201);
    let first = expect(&a, "POST", &source, &[auth, json], b"{\"n\":1}", 204);
    let fork_point = first
        .header("stream-next-offset")
        .expect("offset")
        .to_string();
    expect(&a, "POST", &source, &[auth, json], b"{\"n\":2}", 204);

    // Forked at the first message, on B.
    let from = ("stream-forked-from", source.as_str());
    let at = ("stream-fork-offset", fork_point.as_str());
    let r = expect(&b, "PUT", &fork, &[auth, json, from, at], b"", 201);
    assert_eq!(r.header("stream-next-offset"), Some(fork_point.as_str()));
    expect(&b, "POST", &fork, &[auth, json], b"{\"n\":3}", 204);
    let r = expect(&b, "GET", &format!("{fork}?offset=-1"), &[auth], b"", 200);
    assert_eq!(r.body_str(), "[{\"n\":1},{\"n\":3}]");
    // Asked again, the same fork is the same stream.
    expect(&b, "PUT", &fork, &[auth, json, from, at], b"", 200);

    // The source's own refusals come back as a local fork would get them.
    let gone = ("stream-forked-from", missing.as_str());
    expect(&b, "PUT", &orphan, &[auth, json, gone], b"", 404);
    let text = ("content-type", "text/plain");
    expect(&b, "PUT", &orphan, &[auth, text, from], b"", 409);
    let beyond = ("stream-fork-offset", "9999999999999999_9999999999999999");
    expect(&b, "PUT", &orphan, &[auth, json, from, beyond], b"", 400);

    // Deleted while the fork lives, the source is kept for it (soft-deleted) ...
    expect(&a, "DELETE", &source, &[auth], b"", 204);
    expect(&a, "GET", &source, &[auth], b"", 410);
    // ... and removed once the fork on the other host goes.
    expect(&b, "DELETE", &fork, &[auth], b"", 204);
    wait_for(
        "the source's last reference to go",
        Duration::from_secs(10),
        || req(&a, "GET", &source, &[auth], b"").status == 404,
    );
    expect(&a, "PUT", &source, &[auth, json], b"", 201);
}

/// A fork's reference on its source is named by the token the fork chose: taking it
/// twice or giving it back twice counts once, and a give-back that arrives before its take
/// (the fork's host gave up on a call whose answer was lost) has the take refused, so no
/// reference stays behind for a fork that was never made.
#[test]
fn fork_references_are_named_by_their_tokens() {
    let dir = temp_dir("ursula-cluster-fork-tokens");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, "", 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    for l in 0..LANES {
        adopt(&a, l);
    }
    let json = ("content-type", "application/json");
    let source = "/v1/stream/token-source";
    expect(&a, "PUT", source, &[json], b"", 201);
    expect(&a, "POST", source, &[json], b"{\"n\":1}", 204);
    let call = |path: &str, token: u64| {
        let body = format!(
            r#"{{"source":"c/token-source","source_incarnation":0,"sub_offset":0,"token":{token}}}"#
        );
        req(&a, "POST", path, &[json], body.as_bytes()).status
    };
    let take = |token| call("/__ursula/forks/take", token);
    let give_back = |token| call("/__ursula/forks/release", token);

    assert_eq!(take(1), 200);
    assert_eq!(take(1), 200, "a repeated take");
    assert_eq!(take(2), 200);
    assert_eq!(give_back(1), 204);
    assert_eq!(give_back(1), 204, "a repeated give-back");
    // Token 2 still holds its reference: deleted, the source is kept for it.
    expect(&a, "DELETE", source, &[], b"", 204);
    expect(&a, "GET", source, &[], b"", 410);
    // A give-back ahead of its take: the take is refused and holds nothing.
    assert_eq!(give_back(3), 204);
    assert_eq!(take(3), 409, "the source is soft-deleted");
    assert_eq!(give_back(2), 204);
    wait_for(
        "the source's last reference to go",
        Duration::from_secs(10),
        || req(&a, "GET", source, &[], b"").status == 404,
    );

    // On a live source, a take that comes after its give-back is refused.
    expect(&a, "PUT", source, &[json], b"", 201);
    assert_eq!(give_back(4), 204);
    assert_eq!(take(4), 408);
    expect(&a, "DELETE", source, &[], b"", 204);
    expect(&a, "GET", source, &[], b"", 404);
}

/// Buckets are one namespace across the hosts: a bucket's own requests reach the host
/// that owns its record's lane from any host, a stream on another host's lane finds the
/// bucket there, listings and counts cover every host, a settings change reaches the
/// other hosts' copies, and a deletion removes them.
#[test]
fn buckets_are_one_namespace_across_the_hosts() {
    use ursula_storage::placement::Placement;
    let dir = temp_dir("ursula-cluster-buckets");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, "", 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    let b = host(dir.path(), "b", &config, LANES, MANUAL);
    for l in [0, 1] {
        adopt(&a, l);
    }
    for l in [2, 3] {
        adopt(&b, l);
    }
    let placement = Placement::lane_logs(LANES).expect("placement");
    let lane = |key: &str| placement.shard_of(key) as u32;
    let bucket = (0..)
        .map(|i| format!("telemetry-{i}"))
        .find(|b| lane(&format!("k/{b}")) < 2)
        .expect("a bucket whose record is on A");
    let stream_on = |host_lanes: [u32; 2], same_as: Option<&str>| {
        (0..)
            .map(|i| format!("s{i}"))
            .find(|s| {
                let l = lane(&format!("b/{bucket}/{s}"));
                host_lanes.contains(&l)
                    && same_as.is_none_or(|o| lane(&format!("b/{bucket}/{o}")) == l)
            })
            .expect("a stream name on those lanes")
    };
    let on_a = stream_on([0, 1], None);
    let on_b = stream_on([2, 3], None);
    let also_on_b = (0..)
        .map(|i| format!("auto{i}"))
        .find(|s| lane(&format!("b/{bucket}/{s}")) == lane(&format!("b/{bucket}/{on_b}")))
        .expect("a second stream on that lane");
    let path = |s: &str| format!("/{bucket}/{s}");

    // Created through B, the bucket's record is made on A.
    let r = expect(&b, "PUT", &format!("/{bucket}"), &[], b"", 201);
    let here = format!("http://{}/{bucket}", b.addr);
    assert_eq!(r.header("location"), Some(here.as_str()));
    expect(&a, "PUT", &format!("/{bucket}"), &[], b"", 409);
    expect(&b, "PUT", &format!("/{bucket}"), &[], b"", 409);
    // Streams of it on both hosts.
    expect(&b, "PUT", &path(&on_b), &[OCTETS], b"bee", 201);
    expect(&a, "PUT", &path(&on_a), &[OCTETS], b"ay", 201);

    // Every host lists and counts every host's streams.
    for s in [&a, &b] {
        let r = expect(s, "GET", &format!("/{bucket}/streams"), &[], b"", 200);
        let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("listing");
        let mut names: Vec<&str> = v["streams"]
            .as_array()
            .expect("streams")
            .iter()
            .filter_map(|e| e["stream_id"].as_str())
            .collect();
        names.sort_unstable();
        let mut want = vec![on_a.as_str(), on_b.as_str()];
        want.sort_unstable();
        assert_eq!(names, want, "{}", r.body_str());
        let r = expect(s, "GET", &format!("/{bucket}"), &[], b"", 200);
        assert!(r.body_str().contains("\"streams\":2"), "{}", r.body_str());
        let r = expect(s, "GET", "/", &[], b"", 200);
        let v: sonic_rs::Value = sonic_rs::from_slice(&r.body).expect("bucket listing");
        let listed: Vec<(&str, u64)> = v["buckets"]
            .as_array()
            .expect("buckets")
            .iter()
            .filter_map(|e| Some((e["bucket_id"].as_str()?, e["streams"].as_u64()?)))
            .collect();
        assert_eq!(listed, vec![(bucket.as_str(), 2)], "{}", r.body_str());
    }

    // A change made through B reaches B's copy: a missing stream beside `on_b` is created
    // by its first append there.
    let settings = br#"{"auto_create":{"content_type":"text/plain"}}"#;
    expect(&b, "PATCH", &format!("/{bucket}"), &[], settings, 200);
    let text = ("content-type", "text/plain");
    let r = req(&b, "POST", &path(&also_on_b), &[text], b"hello");
    assert!(r.status / 100 == 2, "auto-created on B: {r:?}");
    expect(
        &b,
        "GET",
        &format!("{}?offset=-1", path(&also_on_b)),
        &[],
        b"",
        200,
    );

    // A change made while a lane is between hosts reaches that lane's copy once a host
    // adopts it: auto-create, turned off, is turned on again while `on_b`'s lane moves.
    expect(
        &b,
        "PATCH",
        &format!("/{bucket}"),
        &[],
        br#"{"auto_create":null}"#,
        200,
    );
    let moving = lane(&format!("b/{bucket}/{on_b}"));
    let late = (0..)
        .map(|i| format!("late{i}"))
        .find(|s| lane(&format!("b/{bucket}/{s}")) == moving)
        .expect("a third stream on that lane");
    expect(&b, "POST", &path(&late), &[text], b"x", 404);
    release(&b, moving);
    // Made on the record and every copy a host runs; its answer (the bucket's stream
    // count) may be a retry while the lane is on no host, and is not retried here.
    let r = req(&a, "PATCH", &format!("/{bucket}"), &[], settings);
    assert!(matches!(r.status, 200 | 503), "{r:?}");
    adopt(&b, moving);
    wait_for(
        "the adopted lane's copy to take the change made while it moved",
        Duration::from_secs(10),
        || req(&b, "POST", &path(&late), &[text], b"x").status / 100 == 2,
    );

    // Not while it has streams; then gone from every host.
    expect(&b, "DELETE", &format!("/{bucket}"), &[], b"", 409);
    for (s, name) in [(&a, &on_a), (&b, &on_b), (&b, &also_on_b), (&b, &late)] {
        expect(s, "DELETE", &path(name), &[], b"", 204);
    }
    expect(&b, "DELETE", &format!("/{bucket}"), &[], b"", 204);
    for s in [&a, &b] {
        expect(s, "GET", &format!("/{bucket}"), &[], b"", 404);
        let r = expect(s, "GET", "/", &[], b"", 200);
        assert!(!r.body_str().contains(&bucket), "{}", r.body_str());
    }
    // B's copies went with it.
    expect(&b, "PUT", &path(&on_b), &[OCTETS], b"", 404);
}

/// Live readers waiting on a lane that moves away end at once (the long-poll with a retry,
/// the SSE response closed) rather than at their timeout, and resume from their offset on
/// the lane's new owner.
#[test]
fn live_readers_end_when_their_lane_moves_and_resume_on_the_new_owner() {
    let dir = temp_dir("ursula-cluster-live");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = config(dir.path(), &s3, "", 200);
    let a = host(dir.path(), "a", &config, LANES, MANUAL);
    let b = host(dir.path(), "b", &config, LANES, MANUAL);
    let path = "/v1/stream/live-0";
    let moved = lane_of(&a, path);
    for l in 0..LANES {
        adopt(&a, l);
    }
    let text = ("content-type", "text/plain");
    expect(&a, "PUT", path, &[text], b"", 201);
    let r = expect(&a, "POST", path, &[text], b"one", 204);
    let tail = r.header("stream-next-offset").expect("tail").to_string();

    let wait_ms = 30_000;
    let (poll, sse) = std::thread::scope(|scope| {
        let poll = scope.spawn(|| {
            let started = Instant::now();
            let url = format!("{path}?offset={tail}&live=long-poll&timeout_ms={wait_ms}");
            (req(&a, "GET", &url, &[], b""), started.elapsed())
        });
        let sse = scope.spawn(|| {
            let mut raw = support::Raw::connect(&a.addr);
            raw.set_read_timeout(Duration::from_millis(wait_ms));
            let head = format!("GET {path}?offset={tail}&live=sse HTTP/1.1\r\nhost: x\r\n\r\n");
            raw.send(head.as_bytes()).expect("send");
            let started = Instant::now();
            let (_, closed) = raw.read_until_close();
            (closed, started.elapsed())
        });
        // Both wait at the tail; then the lane leaves A.
        std::thread::sleep(Duration::from_millis(500));
        release(&a, moved);
        (
            poll.join().expect("long-poll"),
            sse.join().expect("sse reader"),
        )
    });
    let limit = Duration::from_millis(wait_ms / 2);
    let ((r, poll_took), (closed, sse_took)) = (poll, sse);
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert!(poll_took < limit, "the long-poll waited {poll_took:?}");
    assert!(closed, "the SSE response was not closed");
    assert!(
        sse_took < limit,
        "the SSE response stayed open {sse_took:?}"
    );

    // On the new owner, from the same offset.
    adopt(&b, moved);
    expect(&b, "POST", path, &[text], b"two", 204);
    let url = format!("{path}?offset={tail}&live=long-poll&timeout_ms={wait_ms}");
    let r = expect(&b, "GET", &url, &[], b"", 200);
    assert_eq!(r.body_str(), "two");
}
