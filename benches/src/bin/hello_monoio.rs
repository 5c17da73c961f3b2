//! `hello-monoio`: the smallest thread-per-core monoio HTTP/1.1 server we can write, used
//! by `scripts/bench-compare.sh` as the "physical limit" row for small requests. It reads
//! each request (headers with httparse, then Content-Length bytes of body) and answers
//! `200 OK` with an empty body, storing nothing.
//!
//! Usage: hello-monoio [ADDR] [CORES]   (default 127.0.0.1:0 and all cores); prints
//! `hello-monoio listening on http://ADDR` once every core is accepting.

use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

fn main() {
    ursula_benches::CeilingArgs::parse("hello-monoio").serve_on_every_core(
        |_, listener| async move {
            loop {
                if let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    monoio::spawn(serve(stream));
                }
            }
        },
    );
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
        if !ursula_benches::read_more(&mut stream, &mut buf, &mut spare).await {
            return;
        }
    }
}
