//! JSON append-body canonicalisation speed: the server's per-byte CPU for JSON appends.
//!
//! ```text
//! cargo bench -p ursula-benches --bench json            # about 10 s
//! ```
//!
//! Each case canonicalises one request body repeatedly on one thread and prints MB/s of
//! input; the best of five rounds is reported, since this machine is shared.

use std::time::{Duration, Instant};

use ursula_protocol::json::{canonicalize, canonicalize_in_place};

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

/// Best-of-rounds input MB/s of rewriting `bodies` in place (compact arrays), one after
/// another. Each body is put back after its rewrite (a few bytes per message) so the next
/// round sees it again.
fn measure_in_place(bodies: &mut [Vec<u8>]) -> f64 {
    let mut best = 0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let mut bytes = 0usize;
        'round: loop {
            for body in bodies.iter_mut() {
                if start.elapsed() >= Duration::from_millis(400) {
                    break 'round;
                }
                let c = canonicalize_in_place(std::hint::black_box(body), false)
                    .expect("valid body")
                    .expect("compact array");
                bytes += body.len();
                let mut end = c.range.start;
                for len in c.message_lens {
                    end += len as usize;
                    body[end - 1] = b',';
                }
                body[end - 1] = b']';
            }
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
    // What the server does with a request body it owns: no output buffer, no copy.
    let mut in_place_cases = [
        (
            "100 x 200 B ASCII events, in place",
            vec![array(100, 200, 'x')],
        ),
        (
            "512 x 2 KiB ASCII events, in place",
            vec![array(512, 2048, 'x')],
        ),
        (
            "512 x 2 KiB ASCII events, 64 bodies in turn, in place",
            vec![array(512, 2048, 'x'); 64],
        ),
    ];
    for (name, bodies) in &mut in_place_cases {
        let len = bodies[0].len();
        println!("| {name} | {len} | {:.0} |", measure_in_place(bodies));
    }
}
