//! JSON append-body canonicalisation speed: the server's per-byte CPU for JSON appends.
//!
//! ```text
//! cargo bench -p ursula-benches --bench json            # about 10 s
//! ```
//!
//! Each case canonicalises one request body repeatedly on one thread and prints MB/s of
//! input; the best of five rounds is reported, since this machine is shared.

use std::time::{Duration, Instant};

use ursula_protocol::json::canonicalize;

/// One event of exactly `size` bytes, shaped like the loadgen's: `{"i":N,"pad":"xx…"}`.
fn event(i: usize, size: usize, fill: char) -> String {
    let head = format!("{{\"i\":{i},\"pad\":\"");
    let n = size.saturating_sub(head.len() + 2) / fill.len_utf8();
    format!("{head}{}\"}}", fill.to_string().repeat(n))
}

/// A JSON array body of `events` events.
fn array(events: usize, size: usize, fill: char) -> Vec<u8> {
    let items: Vec<String> = (0..events).map(|i| event(i, size, fill)).collect();
    format!("[{}]", items.join(",")).into_bytes()
}

/// Best-of-rounds input MB/s of canonicalising `bodies`, one after another.
fn measure(bodies: &[Vec<u8>]) -> f64 {
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let mut bytes = 0usize;
        for body in bodies.iter().cycle() {
            if start.elapsed() >= Duration::from_millis(400) {
                break;
            }
            let c = canonicalize(std::hint::black_box(body), false).expect("valid body");
            bytes += body.len();
            std::hint::black_box(c);
        }
        best = best.max(bytes as f64 / start.elapsed().as_secs_f64() / 1e6);
    }
    best
}

fn main() {
    let cases = [
        ("100 x 200 B ASCII events", vec![array(100, 200, 'x')]),
        ("512 x 2 KiB ASCII events", vec![array(512, 2048, 'x')]),
        // A server's body is rarely still in L2 when the scan reaches it: 64 distinct
        // bodies take the scan out to L3 or memory.
        (
            "512 x 2 KiB ASCII events, 64 bodies in turn",
            vec![array(512, 2048, 'x'); 64],
        ),
        ("512 x 2 KiB non-ASCII events", vec![array(512, 2048, 'é')]),
        (
            "512 x 2 KiB pretty-printed events",
            vec![array(512, 2048, 'x')
                .iter()
                .flat_map(|&c| if c == b',' { b", ".to_vec() } else { vec![c] })
                .collect()],
        ),
    ];
    println!("| body | bytes | MB/s |\n|---|---|---|");
    for (name, bodies) in &cases {
        println!("| {name} | {} | {:.0} |", bodies[0].len(), measure(bodies));
    }
}
