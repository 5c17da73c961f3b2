//! Routing by lane through a real HAProxy: `deploy/haproxy/ursula-haproxy-config` writes the
//! configuration and lane map for a server with `--core-listen`, and every stream request
//! that HAProxy forwards must reach the core owning its stream (no hand-over between cores),
//! while the same requests sent to the shared port are handed over about half the time.
//!
//! In a cluster, `ursula haproxy-map` keeps the map on the hosts serving each lane while
//! lanes move, and clients through the proxy see one server.
//!
//! Needs Debian's `haproxy` (`scripts/test.sh` installs it; `HAPROXY` names another binary).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::s3::{BUCKET, CREDS, S3};
use support::{temp_dir, write_config, Client, Server, URSULA_BIN};

const CORES: usize = 2;
const LANES: u32 = 16;

/// A child process the test runs (HAProxy, the indexer, `ursula haproxy-map`), killed with
/// the test, and the address it listens on (if any).
struct Running {
    child: Child,
    addr: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn haproxy_bin() -> String {
    if let Ok(bin) = std::env::var("HAPROXY") {
        return bin;
    }
    for bin in ["/usr/sbin/haproxy", "/usr/local/sbin/haproxy"] {
        if Path::new(bin).exists() {
            return bin.to_string();
        }
    }
    panic!("haproxy is not installed (Debian: apt-get install haproxy; scripts/test.sh does)");
}

/// `n` consecutive free ports below the ephemeral range (so no client socket takes one
/// between this check and the server's bind).
fn free_ports(n: u16) -> u16 {
    // The tests of this file run at once in one process: each call starts its search
    // where the last one's range ended, so two tests never settle on the same ports
    // before their servers bind them.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let mut base = 20_000 + (std::process::id() % 5_000) as u16 * 2;
    base = 20_000 + (base - 20_000 + NEXT.fetch_add(n + 50, Ordering::Relaxed)) % 12_000;
    for _ in 0..1_000 {
        let free = (base..base + n).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if free {
            return base;
        }
        base = 20_000 + (base - 20_000 + 97) % 12_000;
    }
    panic!("no {n} consecutive free ports");
}

fn config_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/haproxy/ursula-haproxy-config")
}

/// HAProxy in front of `servers`, each `127.0.0.1:PORT:CORE_PORT`.
fn start_haproxy(dir: &Path, servers: &[String]) -> Running {
    let listen = free_ports(1);
    let mut script = Command::new("sh");
    script.arg(config_script());
    for s in servers {
        script.args(["--server", s]);
    }
    let out = script
        .args(["--cores", &CORES.to_string()])
        .args(["--lanes", &LANES.to_string()])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--dir", dir.to_str().expect("utf-8 dir")])
        .args(["--socket", dir.join("admin.sock").to_str().expect("utf-8")])
        .output()
        .expect("run ursula-haproxy-config");
    assert!(
        out.status.success(),
        "ursula-haproxy-config: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let map = std::fs::read_to_string(dir.join("ursula-lanes.map")).expect("map");
    assert_eq!(map.lines().count(), LANES as usize);
    let child = Command::new(haproxy_bin())
        .args(["-db", "-f"])
        .arg(dir.join("ursula-haproxy.cfg"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start haproxy");
    let hap = Running {
        child,
        addr: format!("127.0.0.1:{listen}"),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let up = Client::new(&hap.addr)
            .request("GET", "/__ursula/readyz", &[], b"")
            .is_ok_and(|r| r.status == 200);
        if up {
            return hap;
        }
        assert!(Instant::now() < deadline, "haproxy did not answer");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The server's count of a per-core counter, summed over cores.
fn counter(server: &Server, name: &str) -> u64 {
    let r = Client::new(&server.addr)
        .request("GET", "/__ursula/metrics", &[], b"")
        .expect("scrape");
    r.body_str()
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Paths that exercise the proxy's key extraction: compat IDs with a slash and
/// percent-encoding, bucketed streams with encoded characters, and their sub-resources.
fn streams() -> Vec<(String, &'static str)> {
    let mut out = Vec::new();
    for i in 0..24 {
        out.push((format!("/v1/stream/plain-{i}"), "text/plain"));
        out.push((format!("/v1/stream/dir/sub%20{i}"), "text/plain"));
        out.push((format!("/lanes/ev-{i}"), "application/json"));
        out.push((format!("/lanes/sp%20ace.{i}"), "application/json"));
    }
    out
}

/// Create every stream, append to each, read each back; every call must succeed.
fn workload(addr: &str, round: usize) {
    let mut c = Client::new(addr);
    let r = c.request("PUT", "/lanes", &[], b"").expect("bucket");
    assert!(r.status == 201 || r.status == 409, "bucket: {}", r.status);
    for (path, ct) in streams() {
        let path = format!("{path}-r{round}");
        let r = c
            .request("PUT", &path, &[("Content-Type", ct)], b"")
            .expect("create");
        assert_eq!(r.status, 201, "create {path}: {}", r.body_str());
        for n in 0..4 {
            let body = if ct == "text/plain" {
                format!("line {n}\n")
            } else {
                format!("{{\"n\":{n}}}")
            };
            let r = c
                .request("POST", &path, &[("Content-Type", ct)], body.as_bytes())
                .expect("append");
            assert_eq!(r.status, 204, "append {path}: {}", r.body_str());
        }
        let r = c
            .request("GET", &format!("{path}?offset=-1"), &[], b"")
            .expect("read");
        assert_eq!(r.status, 200, "read {path}");
        if ct == "text/plain" {
            assert_eq!(r.body_str(), "line 0\nline 1\nline 2\nline 3\n");
        } else {
            assert_eq!(r.body_str().lines().count(), 4, "{path}: {}", r.body_str());
            let r = c
                .request("GET", &format!("{path}/producers"), &[], b"")
                .expect("producers");
            assert_eq!(r.status, 200, "producers {path}");
        }
    }
    let r = c.request("GET", "/lanes/streams", &[], b"").expect("list");
    assert_eq!(r.status, 200);
}

#[test]
fn haproxy_routes_each_stream_to_its_core() {
    let dir = temp_dir("ursula-haproxy");
    let core_port = free_ports(CORES as u16);
    let server = Server::spawn_standard(
        &dir.path().join("data"),
        "disk",
        CORES,
        &[
            "--lanes",
            &LANES.to_string(),
            "--core-listen",
            &format!("127.0.0.1:{core_port}"),
        ],
        None,
    );
    let server_port: u16 = server
        .addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("server port");
    // The server's own account of its lanes, which the proxy's map must match.
    let r = Client::new(&server.addr)
        .request("GET", "/__ursula/lanes", &[], b"")
        .expect("lanes");
    assert_eq!(r.status, 200);
    let lanes: Value = sonic_rs::from_slice(&r.body).expect("lanes JSON");
    assert_eq!(lanes["placement"].as_str(), Some("crc32c"));
    assert_eq!(lanes["lane_count"].as_u64(), Some(u64::from(LANES)));
    assert_eq!(
        lanes["core_ports"][1].as_u64(),
        Some(u64::from(core_port) + 1)
    );
    assert_eq!(
        lanes["lanes"].as_array().map(|a| a.len()),
        Some(LANES as usize)
    );
    assert_eq!(lanes["lanes"][5]["core"].as_u64(), Some(1));
    assert_eq!(
        lanes["lanes"][5]["port"].as_u64(),
        Some(u64::from(core_port) + 1)
    );

    let hap = start_haproxy(
        &dir.path().join("haproxy"),
        &[format!("127.0.0.1:{server_port}:{core_port}")],
    );

    let handed = counter(&server, "ursula_requests_handed_over_total");
    let served = counter(&server, "ursula_core_requests_total");
    workload(&hap.addr, 0);
    let proxied = counter(&server, "ursula_core_requests_total") - served;
    assert!(proxied >= streams().len() as u64 * 6, "{proxied} requests");
    assert_eq!(
        counter(&server, "ursula_requests_handed_over_total") - handed,
        0,
        "a request HAProxy routed by lane was handed to another core"
    );

    // The same requests on the shared port land on either core, and about half of them
    // must be handed over: the counter sees a misroute.
    workload(&server.addr, 1);
    let direct = counter(&server, "ursula_requests_handed_over_total") - handed;
    assert!(
        direct > streams().len() as u64,
        "only {direct} of the direct requests were handed over"
    );

    // A long-poll through the proxy is answered by the append that arrives later.
    let path = "/lanes/ev-3-r0";
    let url = format!("{path}?offset=-1");
    let tail = Client::new(&hap.addr)
        .request("HEAD", &url, &[], b"")
        .expect("head");
    let next = tail
        .header("Stream-Next-Offset")
        .expect("next offset")
        .to_string();
    let addr = hap.addr.clone();
    let poll = std::thread::spawn(move || {
        let mut c = Client::new(&addr);
        c.request(
            "GET",
            &format!("{path}?offset={next}&live=long-poll"),
            &[],
            b"",
        )
        .expect("long-poll")
    });
    std::thread::sleep(Duration::from_millis(100));
    let r = Client::new(&hap.addr)
        .request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            b"{\"late\":true}",
        )
        .expect("append");
    assert_eq!(r.status, 204);
    let r = poll.join().expect("poller");
    assert_eq!(r.status, 200, "long-poll: {}", r.body_str());
    assert!(r.body_str().contains("late"), "{}", r.body_str());
}

/// A cluster host on fixed ports: `port` shared, `port + 1 ..` its cores'.
fn cluster_host(dir: &Path, name: &str, config: &str, port: u16) -> Server {
    let data = dir.join(name);
    let listen = format!("127.0.0.1:{port}");
    let core_listen = format!("127.0.0.1:{}", port + 1);
    let lanes = LANES.to_string();
    let args = [
        "server",
        "--listen",
        &listen,
        "--core-listen",
        &core_listen,
        "--advertise",
        &listen,
        "--data-dir",
        data.to_str().expect("utf-8"),
        "--cores",
        "2",
        "--cluster",
        "--lanes",
        &lanes,
        "--config",
        config,
    ];
    let log = dir.join(format!("{name}.log"));
    Server::spawn_with_env(&args, &CREDS, Some(&log), Duration::from_secs(60))
}

/// The lanes a host says it serves.
fn served(s: &Server) -> usize {
    let r = Client::new(&s.addr)
        .request("GET", "/__ursula/lanes", &[], b"")
        .expect("lanes");
    let v: Value = sonic_rs::from_slice(&r.body).expect("lanes JSON");
    v["lanes"]
        .as_array()
        .expect("lanes")
        .iter()
        .filter(|l| l["state"].as_str() == Some("served"))
        .count()
}

/// An append through the proxy with producer headers, retried until it is acknowledged
/// (a retry of one that landed is answered as a duplicate). Returns when it was.
fn append_until_acknowledged(proxy: &str, path: &str, producer: &str, seq: u64, body: &[u8]) {
    append_typed_until_acknowledged(proxy, path, "application/octet-stream", producer, seq, body)
}

/// [`append_until_acknowledged`] with content type `ct`.
fn append_typed_until_acknowledged(
    proxy: &str,
    path: &str,
    ct: &str,
    producer: &str,
    seq: u64,
    body: &[u8],
) {
    let seq = seq.to_string();
    let headers = [
        ("content-type", ct),
        ("producer-id", producer),
        ("producer-epoch", "0"),
        ("producer-seq", seq.as_str()),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::new(proxy).request("POST", path, &headers, body) {
            Ok(r) if r.status == 200 || r.status == 204 => return,
            Ok(r) if [421, 502, 503, 504].contains(&r.status) => {}
            Ok(r) => panic!("POST {path} seq {seq}: {r:?} {}", r.body_str()),
            Err(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "POST {path} seq {seq} not acknowledged in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A read of `target` (a path and query) through the proxy, retried while it answers `503`
/// (a lane still settling after a failover, or HAProxy briefly without a healthy server
/// for it), as a client honouring `Retry-After` does.
fn read_until_answered(proxy: &str, target: &str) -> support::Response {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = Client::new(proxy)
            .request("GET", target, &[], b"")
            .expect("read");
        if r.status != 503 {
            assert_eq!(r.status, 200, "GET {target}: {r:?}");
            return r;
        }
        assert!(Instant::now() < deadline, "GET {target}: 503 for 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `ursula-indexer` (built beside `ursula`) on a local store.
fn start_indexer(dir: &Path) -> Running {
    {
        let bin = Path::new(URSULA_BIN).with_file_name("ursula-indexer");
        assert!(
            bin.exists(),
            "{} is not built (cargo build --workspace)",
            bin.display()
        );
        let log = std::fs::File::create(dir.join("indexer.log")).expect("indexer log");
        let mut child = Command::new(&bin)
            .args(["--listen", "127.0.0.1:0", "--store-dir"])
            .arg(dir.join("index"))
            .args(["--commit-interval-ms", "200", "--poll-interval-ms", "100"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start ursula-indexer");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the indexer's listening line");
        let addr = line
            .strip_prefix("ursula-indexer listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Running { child, addr }
    }
}

/// The times of the events index `id` of the indexer at `indexer` answers for
/// `[from, until)`, each checked to be where its locator says by reading it through `proxy`.
fn indexed_times(indexer: &str, id: &str, proxy: &str, path: &str, span: (i64, i64)) -> Vec<i64> {
    let (from, until) = span;
    {
        let r = Client::new(indexer)
            .request(
                "GET",
                &format!("/v1/indexes/{id}/events?from={from}&until={until}"),
                &[],
                b"",
            )
            .expect("events");
        assert_eq!(r.status, 200, "events {id}: {}", r.body_str());
        let v: Value = sonic_rs::from_slice(&r.body).expect("events JSON");
        let mut times = Vec::new();
        for e in v["entries"].as_array().expect("entries").iter() {
            let t = e["t_ms"].as_i64().expect("t_ms");
            let offset = e["offset"].as_str().expect("offset");
            let got = read_until_answered(proxy, &format!("{path}?offset={offset}"));
            assert!(
                got.body_str()
                    .starts_with(&format!("[{{\"captured_at\":{t}}}")),
                "{path} at {offset} for t={t}: {}",
                got.body_str()
            );
            times.push(t);
        }
        times.sort_unstable();
        times
    }
}

/// Event time of the first event the indexer test writes.
const T0: i64 = 1_784_370_600_000;

#[test]
fn haproxy_follows_a_clusters_lanes_through_a_host_loss() {
    let dir = temp_dir("ursula-haproxy-cluster");
    let s3 = S3::start(&dir.path().join("s3"), 0);
    let config = write_config(
        dir.path(),
        &format!(
            "durability = \"s3\"\ncluster_heartbeat_ms = 250\ncluster_lease_ms = 2500\n\
             [cold_tier]\ns3_bucket = \"{BUCKET}\"\ns3_prefix = \"proxy\"\n\
             s3_endpoint = \"{}\"\ns3_region = \"us-east-1\"\narchive_interval_ms = 1000\n",
            s3.endpoint()
        ),
    );
    let ports = free_ports(2 * (CORES as u16 + 1));
    let (pa, pb) = (ports, ports + CORES as u16 + 1);
    let a = cluster_host(dir.path(), "a", &config, pa);
    let b = cluster_host(dir.path(), "b", &config, pb);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(served(&a) > 0 && served(&b) > 0 && served(&a) + served(&b) == LANES as usize) {
        assert!(
            Instant::now() < deadline,
            "the hosts did not share the lanes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let hdir = dir.path().join("haproxy");
    let hap = start_haproxy(
        &hdir,
        &[
            format!("127.0.0.1:{pa}:{}", pa + 1),
            format!("127.0.0.1:{pb}:{}", pb + 1),
        ],
    );
    let map = hdir.join("ursula-lanes.map");
    let _sync = Running {
        child: Command::new(URSULA_BIN)
            .args(["haproxy-map", "--interval-ms", "100"])
            .args(["--host", &format!("http://127.0.0.1:{pa}")])
            .args(["--host", &format!("http://127.0.0.1:{pb}")])
            .arg("--map")
            .arg(&map)
            .arg("--socket")
            .arg(hdir.join("admin.sock"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ursula haproxy-map"),
        addr: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&map).is_ok_and(|m| m.contains("ursula_any")) {
        assert!(Instant::now() < deadline, "the map was never completed");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Through the proxy every request lands on the lane's owner at once: no 421.
    let streams: Vec<String> = (0..24).map(|i| format!("/v1/stream/px-{i}")).collect();
    let mut want: Vec<Vec<u8>> = Vec::new();
    let octets = ("content-type", "application/octet-stream");
    for (i, path) in streams.iter().enumerate() {
        let r = Client::new(&hap.addr)
            .request("PUT", path, &[octets], b"")
            .expect("create");
        assert_eq!(r.status, 201, "PUT {path} through the proxy: {r:?}");
        let body = format!("{i}-0;");
        append_until_acknowledged(&hap.addr, path, &format!("p{i}"), 0, body.as_bytes());
        want.push(body.into_bytes());
    }

    // The indexer follows JSON streams through the proxy, on both hosts' lanes.
    let indexer = start_indexer(dir.path());
    // Three streams on each host: a host answers 404 for a missing stream of its own
    // lanes and 421 for one of the other's.
    let on_b = |p: &String| {
        Client::new(&b.addr)
            .request("HEAD", p, &[], b"")
            .is_ok_and(|r| r.status == 404)
    };
    let candidates: Vec<String> = (0..64).map(|i| format!("/v1/stream/ix-{i}")).collect();
    let (mut indexed, of_a): (Vec<String>, Vec<String>) =
        candidates.into_iter().partition(|p| on_b(p));
    indexed.truncate(3);
    indexed.extend(of_a.into_iter().take(3));
    assert_eq!(indexed.len(), 6, "64 streams all on one host");
    // Event k at T0 + k ms, as producer "ix" sequence k.
    let append_events = |path: &str, ks: std::ops::Range<i64>| {
        for k in ks {
            let event = format!(r#"{{"captured_at":{}}}"#, T0 + k);
            let ct = "application/json";
            append_typed_until_acknowledged(&hap.addr, path, ct, "ix", k as u64, event.as_bytes());
        }
    };
    for (i, path) in indexed.iter().enumerate() {
        let r = Client::new(&hap.addr)
            .request("PUT", path, &[("content-type", "application/json")], b"")
            .expect("create");
        assert_eq!(r.status, 201, "PUT {path}: {r:?}");
        let body = format!(r#"{{"stream_url":"http://{}{path}"}}"#, hap.addr);
        let r = Client::new(&indexer.addr)
            .request("PUT", &format!("/v1/indexes/ix{i}"), &[], body.as_bytes())
            .expect("register");
        assert_eq!(r.status, 201, "register ix{i}: {}", r.body_str());
        append_events(path, 0..10);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, path) in indexed.iter().enumerate() {
        let id = format!("ix{i}");
        while indexed_times(&indexer.addr, &id, &hap.addr, path, (T0, T0 + 100)).len() < 10 {
            assert!(
                Instant::now() < deadline,
                "ix{i} did not index its first events"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // B dies with its disk; appends through the proxy are acknowledged again once A has
    // adopted B's lanes and the map names A.
    b.kill9();
    std::fs::remove_dir_all(dir.path().join("b")).expect("lose b's disk");
    let killed = Instant::now();
    for (i, path) in streams.iter().enumerate() {
        let body = format!("{i}-1;");
        append_until_acknowledged(&hap.addr, path, &format!("p{i}"), 1, body.as_bytes());
        want[i].extend_from_slice(body.as_bytes());
    }
    eprintln!(
        "every stream writable through the proxy {:?} after the host was killed",
        killed.elapsed()
    );
    for (path, bytes) in streams.iter().zip(&want) {
        let r = read_until_answered(&hap.addr, &format!("{path}?offset=-1"));
        assert_eq!(
            &r.body, bytes,
            "{path} through the proxy after the failover"
        );
    }
    assert_eq!(served(&a), LANES as usize);

    // The indexer kept following through the proxy: the events written after the
    // failover are indexed too, each once, each where its locator says.
    for path in &indexed {
        append_events(path, 10..20);
    }
    let want: Vec<i64> = (0..20).map(|k| T0 + k).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, path) in indexed.iter().enumerate() {
        loop {
            let got = indexed_times(
                &indexer.addr,
                &format!("ix{i}"),
                &hap.addr,
                path,
                (T0, T0 + 100),
            );
            if got == want {
                break;
            }
            assert!(
                got.len() <= want.len(),
                "ix{i} indexed an event twice: {got:?}"
            );
            assert!(
                Instant::now() < deadline,
                "ix{i} did not index the events written after the failover: {got:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
