//! Routing by lane through a real HAProxy: `deploy/haproxy/ursula-haproxy-config` writes the
//! configuration and lane map for a server with `--core-listen`, and every stream request
//! that HAProxy forwards must reach the core owning its stream (no hand-over between cores),
//! while the same requests sent to the shared port are handed over about half the time.
//!
//! Needs Debian's `haproxy` (`scripts/test.sh` installs it; `HAPROXY` names another binary).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sonic_rs::{JsonContainerTrait, JsonValueTrait, Value};
use support::{temp_dir, Client, Server};

const CORES: usize = 2;
const LANES: u32 = 16;

/// HAProxy, killed with the test.
struct Haproxy {
    child: Child,
    addr: String,
}

impl Drop for Haproxy {
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
    let mut base = 20_000 + (std::process::id() % 5_000) as u16 * 2;
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

fn start_haproxy(dir: &Path, server_port: u16, core_port: u16) -> Haproxy {
    let listen = free_ports(1);
    let out = Command::new("sh")
        .arg(config_script())
        .args(["--server", "127.0.0.1"])
        .args(["--port", &server_port.to_string()])
        .args(["--core-port", &core_port.to_string()])
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
    let hap = Haproxy {
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

    let hap = start_haproxy(&dir.path().join("haproxy"), server_port, core_port);

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
