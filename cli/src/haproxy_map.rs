//! `ursula haproxy-map`: keep HAProxy's lane map current for a cluster.
//!
//! Every interval it asks each host for its lanes (`/__ursula/lanes`), names the backend
//! of the core serving each lane as `deploy/haproxy/ursula-haproxy-config` does
//! (`ursula_<host>_<port>_core<N>`, from the host's URL), and sends HAProxy a `set map`
//! for every lane whose backend changed, through its runtime API socket: no reload, no
//! dropped connection. The map file is rewritten too (renamed into place), so a reload
//! or restart of HAProxy starts from the current map. A lane no host serves goes to
//! `ursula_any`, whose answer (a 421 naming the owner, or a 503 while the lane moves)
//! is right until the next look; a lane two hosts claim during a takeover goes to the
//! one with the newer owner epoch.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use sonic_rs::{JsonContainerTrait, JsonValueTrait};

use crate::client::{Client, Request};
use crate::{Connection, Error};

/// The backend of a lane no host serves.
const ANY: &str = "ursula_any";

/// How long a host may take to connect and answer before this look goes on without it: a
/// host that is stopped or cut off must not hold the others' lanes back.
const LOOK_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct HaproxyMapArgs {
    /// A cluster host's URL as HAProxy reaches it (`http://10.0.0.5:4437`); repeat for
    /// every host.
    #[arg(long = "host", value_name = "URL", required = true)]
    pub hosts: Vec<String>,
    /// The lane map HAProxy reads, as its configuration names it.
    #[arg(long, value_name = "PATH")]
    pub map: PathBuf,
    /// HAProxy's runtime API socket (`stats socket ... level admin`).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// How often to look at the hosts, in ms.
    #[arg(long, default_value_t = 500)]
    pub interval_ms: u64,
    /// Look once, update the map, and exit.
    #[arg(long)]
    pub once: bool,
    /// The token and CA for the hosts (`--server` is ignored: the hosts are `--host`).
    #[command(flatten)]
    pub connection: Connection,
}

pub fn run(args: HaproxyMapArgs) -> Result<(), Error> {
    let mut hosts = Vec::with_capacity(args.hosts.len());
    for url in &args.hosts {
        let connection = Connection {
            server: Some(url.clone()),
            token: args.connection.token.clone(),
            token_file: args.connection.token_file.clone(),
            cacert: args.connection.cacert.clone(),
            json: false,
        };
        let client = Client::new(&connection)?.connect_within(LOOK_TIMEOUT);
        hosts.push((backend_prefix(url)?, client));
    }
    let mut current = read_map(&args.map)?;
    let mut newest = vec![0; current.len()];
    loop {
        let wanted = wanted_map(&mut hosts, &mut newest);
        let changes: Vec<(usize, &str)> = wanted
            .iter()
            .enumerate()
            .filter(|(lane, backend)| current.get(*lane).map(String::as_str) != Some(backend))
            .map(|(lane, backend)| (lane, backend.as_str()))
            .collect();
        if !changes.is_empty() {
            match set_map(&args.socket, &args.map, &changes) {
                Ok(()) => {
                    for (lane, backend) in &changes {
                        println!("lane {lane} -> {backend}");
                    }
                    write_map(&args.map, &wanted)?;
                    current = wanted;
                }
                Err(e) => eprintln!("ursula haproxy-map: {e}"),
            }
        }
        if args.once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.interval_ms.max(10)));
    }
}

/// The backend name prefix of a host's cores: `ursula_<host>_<port>_core`.
fn backend_prefix(url: &str) -> Result<String, Error> {
    let address = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    if address.is_empty() {
        return Err(Error::Usage(format!("--host {url}: no host in the URL")));
    }
    let address = if address.contains(':') {
        address.to_string()
    } else if url.starts_with("https://") {
        format!("{address}:443")
    } else {
        format!("{address}:80")
    };
    let name: String = address
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    Ok(format!("ursula_{name}_core"))
}

/// The backend each lane should have now, from every host that answers (all asked at
/// once): the serving host's core, the newer owner epoch winning a lane claimed twice;
/// `ursula_any` else. `newest` is each lane's highest owner epoch seen so far: a host
/// still reporting an older one (paused or cut off while the lane was taken over) is
/// never routed to again.
fn wanted_map(hosts: &mut [(String, Client)], newest: &mut [u64]) -> Vec<String> {
    let mut best: Vec<Option<(u64, String)>> = vec![None; newest.len()];
    let answers: Vec<_> = std::thread::scope(|scope| {
        let asking: Vec<_> = hosts
            .iter_mut()
            .map(|(prefix, client)| {
                scope.spawn(move || {
                    let look = Request::new("GET", "/__ursula/lanes").wait(LOOK_TIMEOUT);
                    let answer = client.send(&look);
                    (prefix.as_str(), client.url_of("/__ursula/lanes"), answer)
                })
            })
            .collect();
        asking.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    for (prefix, url, answer) in answers {
        let view = match answer {
            Ok(r) if r.status == 200 => sonic_rs::from_slice::<sonic_rs::Value>(&r.body).ok(),
            Ok(r) => {
                eprintln!("ursula haproxy-map: {url}: status {}", r.status);
                None
            }
            Err(e) => {
                eprintln!("ursula haproxy-map: {e}");
                None
            }
        };
        let Some(view) = view else { continue };
        let Some(list) = view.get("lanes").and_then(|l| l.as_array()) else {
            continue;
        };
        for lane in list.iter() {
            if lane.get("state").and_then(|s| s.as_str()) != Some("served") {
                continue;
            }
            let (Some(n), Some(core)) = (
                lane.get("lane").and_then(|l| l.as_u64()),
                lane.get("core").and_then(|c| c.as_u64()),
            ) else {
                continue;
            };
            let epoch = lane
                .get("archive")
                .and_then(|a| a.get("epoch"))
                .and_then(|e| e.as_u64())
                .unwrap_or(0);
            let Some(seen) = newest.get_mut(n as usize) else {
                continue;
            };
            if epoch < *seen {
                continue;
            }
            *seen = epoch;
            if let Some(slot) = best.get_mut(n as usize) {
                if slot.as_ref().is_none_or(|(e, _)| epoch > *e) {
                    *slot = Some((epoch, format!("{prefix}{core}")));
                }
            }
        }
    }
    best.into_iter()
        .map(|b| b.map_or_else(|| ANY.to_string(), |(_, backend)| backend))
        .collect()
}

/// The map file's backends, by lane (its lines are `<lane> <backend>`, lanes in order).
fn read_map(path: &Path) -> Result<Vec<String>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Usage(format!("cannot read the map {}: {e}", path.display())))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut words = line.split_whitespace();
        match (
            words.next().and_then(|l| l.parse::<usize>().ok()),
            words.next(),
        ) {
            (Some(lane), Some(backend)) if lane == out.len() => out.push(backend.to_string()),
            _ => {
                return Err(Error::Usage(format!(
                    "{} line {}: expected `{} <backend>` (written by ursula-haproxy-config)",
                    path.display(),
                    i + 1,
                    out.len()
                )))
            }
        }
    }
    Ok(out)
}

fn write_map(path: &Path, backends: &[String]) -> Result<(), Error> {
    let text: String = backends
        .iter()
        .enumerate()
        .map(|(lane, backend)| format!("{lane} {backend}\n"))
        .collect();
    let tmp = path.with_extension("map.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| Error::Usage(format!("cannot write the map {}: {e}", path.display())))
}

/// Send HAProxy one `set map` per change, in one runtime API command line.
fn set_map(socket: &Path, map: &Path, changes: &[(usize, &str)]) -> Result<(), Error> {
    let commands: Vec<String> = changes
        .iter()
        .map(|(lane, backend)| format!("set map {} {lane} {backend}", map.display()))
        .collect();
    let fail = |e: std::io::Error| {
        Error::Usage(format!("HAProxy runtime API at {}: {e}", socket.display()))
    };
    let mut conn = UnixStream::connect(socket).map_err(fail)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(fail)?;
    conn.write_all(format!("{}\n", commands.join(";")).as_bytes())
        .map_err(fail)?;
    let mut answer = String::new();
    conn.read_to_string(&mut answer).map_err(fail)?;
    // Success is silent; anything else is HAProxy saying why.
    let answer = answer.trim();
    if answer.is_empty() {
        Ok(())
    } else {
        Err(Error::Usage(format!("HAProxy refused `set map`: {answer}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_named_after_the_hosts_address() {
        assert_eq!(
            backend_prefix("http://10.0.0.5:4437").expect("url"),
            "ursula_10_0_0_5_4437_core"
        );
        assert_eq!(
            backend_prefix("https://streams.example.com/").expect("url"),
            "ursula_streams_example_com_443_core"
        );
        assert!(backend_prefix("http://").is_err());
    }

    #[test]
    fn the_map_file_reads_and_writes_lane_by_lane() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("lanes.map");
        write_map(&path, &["a".into(), "b".into(), ANY.into()]).expect("write");
        assert_eq!(read_map(&path).expect("read"), ["a", "b", ANY]);
        std::fs::write(&path, "0 a\n2 b\n").expect("write");
        assert!(read_map(&path).is_err(), "a lane out of order is refused");
    }
}
