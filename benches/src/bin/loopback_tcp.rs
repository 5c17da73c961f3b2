//! `loopback-tcp`: raw TCP throughput over 127.0.0.1, the ceiling for `read` in
//! `scripts/bench-compare.sh`. N sender threads each stream 1 MiB writes to a receiver
//! thread that discards them, for the given number of seconds.
//!
//! Usage: loopback-tcp [SECONDS] [CONNECTIONS]   (default 5 s, 2 connections); prints
//! `loopback-tcp MB/s <value>`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn main() {
    let mut args = std::env::args().skip(1);
    let secs: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(5.0);
    let conns: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(2).max(1);
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let receivers: Vec<_> = (0..conns)
        .map(|_| {
            let listener = listener.try_clone().expect("clone listener");
            std::thread::spawn(move || {
                let Ok((mut s, _)) = listener.accept() else {
                    return 0;
                };
                let mut buf = vec![0u8; 1 << 20];
                let mut total = 0u64;
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                total
            })
        })
        .collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let senders: Vec<_> = (0..conns)
        .map(|_| {
            std::thread::spawn(move || {
                let Ok(mut s) = TcpStream::connect(addr) else {
                    return;
                };
                let buf = vec![7u8; 1 << 20];
                while Instant::now() < deadline {
                    if s.write_all(&buf).is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    for s in senders {
        let _ = s.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let bytes: u64 = receivers.into_iter().map(|r| r.join().unwrap_or(0)).sum();
    println!("loopback-tcp MB/s {:.1}", bytes as f64 / elapsed / 1e6);
}
