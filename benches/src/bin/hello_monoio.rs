//! `hello-monoio`: the smallest thread-per-core monoio HTTP/1.1 server we can write, used
//! by `scripts/bench-compare.sh` as the "physical limit" row for small requests. It reads
//! each request (headers with httparse, then Content-Length bytes of body) and answers
//! `200 OK` with an empty body, storing nothing.
//!
//! Usage: hello-monoio [ADDR] [CORES]   (default 127.0.0.1:0 and all cores); prints
//! `hello-monoio listening on http://ADDR` once every core is accepting.

use std::net::SocketAddr;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::{ListenerOpts, TcpListener, TcpStream};

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

fn main() {
    let mut args = std::env::args().skip(1);
    let addr: SocketAddr = match args.next().unwrap_or_else(|| "127.0.0.1:0".into()).parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("hello-monoio: bad address: {e}");
            std::process::exit(2);
        }
    };
    let cores = args
        .next()
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // Bind the first listener here to learn the port, then give every core its own
    // SO_REUSEPORT listener on it.
    let opts = ListenerOpts::new().reuse_port(true).reuse_addr(true);
    let first = std::net::TcpListener::bind(addr).expect("bind");
    let bound = first.local_addr().expect("local addr");
    drop(first);
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for core in 0..cores {
        let tx = tx.clone();
        threads.push(std::thread::spawn(move || {
            let _ = monoio::utils::bind_to_cpu_set([core]);
            let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                .with_entries(1024)
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let listener = TcpListener::bind_with_config(bound, &opts).expect("bind core");
                let _ = tx.send(());
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let _ = stream.set_nodelay(true);
                        monoio::spawn(serve(stream));
                    }
                }
            });
        }));
    }
    for _ in 0..cores {
        let _ = rx.recv();
    }
    println!("hello-monoio listening on http://{bound}");
    for t in threads {
        let _ = t.join();
    }
}

async fn serve(mut stream: TcpStream) {
    let mut buf: Vec<u8> = Vec::with_capacity(64 << 10);
    let mut spare: Vec<u8> = Vec::with_capacity(64 << 10);
    loop {
        // Answer every complete request in the buffer (pipelining), then read more.
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            let head = match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) => break,
                Err(_) => return,
            };
            let body = req
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case("content-length"))
                .and_then(|h| {
                    std::str::from_utf8(h.value)
                        .ok()?
                        .trim()
                        .parse::<usize>()
                        .ok()
                })
                .unwrap_or(0);
            if buf.len() < head + body {
                break;
            }
            buf.drain(..head + body);
            let (res, _) = stream.write_all(RESPONSE).await;
            if res.is_err() {
                return;
            }
        }
        let (res, got) = stream.read(std::mem::take(&mut spare)).await;
        buf.extend_from_slice(&got);
        spare = got;
        spare.clear();
        match res {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}
