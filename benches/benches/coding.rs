//! Compressed bodies: what decoding an append costs, and what compressing a read would.
//!
//! ```text
//! cargo bench -p ursula-benches --bench coding          # about 15 s
//! ```
//!
//! On about 16 MiB of generated browser telemetry as NDJSON (random ids, repeated field
//! names and values, about 400 bytes per event), one thread, best of five rounds, since
//! this machine is shared:
//!
//! * decoding gzip (level 6) and zstd (level 3) bodies with the libraries the server uses
//!   (flate2 on zlib-rs, zstd), in MB of decoded output per second;
//! * setting up a decoder for a small (1 KiB) body: a new zstd context against a reused
//!   one, and a new gzip state;
//! * compressing 1 MiB pieces (a read response is at most 8 MiB) at gzip level 1 and 6 and
//!   zstd level 1 and 3: CPU per MB of input and the bytes saved, which is what honouring
//!   `Accept-Encoding` on reads would cost and gain (docs/benchmarks.md, "Compressed
//!   appends");
//! * the NDJSON canonicalisation of the same bytes (`canonicalize_lines`), for scale.

use std::io::Write;
use std::time::{Duration, Instant};

use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

/// A small xorshift generator: the same telemetry on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// About `bytes` bytes of NDJSON telemetry events.
fn telemetry(bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    let types = [
        "click",
        "navigation",
        "network_response",
        "long_task",
        "web_vital",
    ];
    let pages = [
        "/",
        "/cart",
        "/checkout",
        "/search?q=shoes",
        "/account/orders",
    ];
    let agents = [
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/126.0 Safari/537.36",
        "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1",
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:127.0) Gecko/20100101 Firefox/127.0",
    ];
    let mut out = String::with_capacity(bytes + 512);
    while out.len() < bytes {
        let t = rng.pick(&types);
        out.push_str(&format!(
            "{{\"captured_at\":\"2026-07-18T10:{:02}:{:02}.{:03}Z\",\"type\":\"{t}\",\"session_id\":\"{:016x}\",\"trace_id\":\"{:016x}{:016x}\",\"page\":\"https://shop.example{}\",\"user_agent\":\"{}\",\"viewport\":{{\"w\":1440,\"h\":900}}",
            rng.next() % 60,
            rng.next() % 60,
            rng.next() % 1000,
            rng.next(),
            rng.next(),
            rng.next(),
            rng.pick(&pages),
            rng.pick(&agents),
        ));
        if t == "network_response" {
            out.push_str(&format!(
                ",\"url\":\"https://api.shop.example/v2/items/{}\",\"status\":200,\"duration_ms\":{}.{}",
                rng.next() % 100_000,
                rng.next() % 1200,
                rng.next() % 10
            ));
        }
        out.push_str("}\n");
    }
    out.into_bytes()
}

fn gzip(data: &[u8], level: u32) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 4),
        flate2::Compression::new(level),
    );
    e.write_all(data).expect("in memory");
    e.finish().expect("in memory")
}

fn zstd(data: &[u8], level: i32) -> Vec<u8> {
    zstd::bulk::compress(data, level).expect("in memory")
}

/// Best-of-five seconds of one run of `f`.
fn best_of(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// Best-of-five microseconds per call of `f`, over about 300 ms per round.
fn micros_each(mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_millis(300) {
            for _ in 0..64 {
                f();
            }
            n += 64;
        }
        best = best.min(start.elapsed().as_secs_f64() * 1e6 / n as f64);
    }
    best
}

fn decode_zstd(decoder: &mut Decoder<'static>, body: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut input = InBuffer::around(body);
    let mut output = OutBuffer::around_pos(out, 0);
    decoder.run(&mut input, &mut output).expect("valid frame");
}

fn new_zstd() -> Decoder<'static> {
    let mut d = Decoder::new().expect("context");
    d.set_parameter(DParameter::WindowLogMax(23))
        .expect("window cap");
    d
}

fn main() {
    let data = telemetry(16 << 20, 42);
    let mb = data.len() as f64 / 1e6;
    println!(
        "{:.1} MB of NDJSON telemetry, {} events",
        mb,
        data.iter().filter(|&&c| c == b'\n').count()
    );

    println!("\ndecoding a compressed append (MB/s of decoded output, one thread)");
    let gz = gzip(&data, 6);
    let zs = zstd(&data, 3);
    let s = best_of(|| {
        let mut inflate = flate2::Decompress::new_gzip(15);
        let mut out = Vec::with_capacity(data.len());
        inflate
            .decompress_vec(&gz, &mut out, flate2::FlushDecompress::Finish)
            .expect("valid gzip");
        assert_eq!(out.len(), data.len());
    });
    println!(
        "  gzip -6 body ({:.1}x smaller)  {:7.0} MB/s  {:5.2} ms CPU per decoded MB",
        data.len() as f64 / gz.len() as f64,
        mb / s,
        s * 1e3 / mb
    );
    let mut decoder = new_zstd();
    let mut out = Vec::with_capacity(data.len());
    let s = best_of(|| {
        decoder.reinit().expect("reset");
        decode_zstd(&mut decoder, &zs, &mut out);
        assert_eq!(out.len(), data.len());
    });
    println!(
        "  zstd -3 body ({:.1}x smaller)  {:7.0} MB/s  {:5.2} ms CPU per decoded MB",
        data.len() as f64 / zs.len() as f64,
        mb / s,
        s * 1e3 / mb
    );

    println!("\nsetting up a decoder for one 1 KiB body (and decoding it)");
    let small = telemetry(1000, 7);
    let (small_gz, small_zs) = (gzip(&small, 6), zstd(&small, 3));
    let mut out = Vec::with_capacity(16 << 10);
    let us = micros_each(|| {
        let mut inflate = flate2::Decompress::new_gzip(15);
        out.clear();
        inflate
            .decompress_vec(&small_gz, &mut out, flate2::FlushDecompress::Finish)
            .expect("valid gzip");
    });
    println!("  gzip, new state          {us:6.2} us");
    let us = micros_each(|| {
        let mut d = new_zstd();
        decode_zstd(&mut d, &small_zs, &mut out);
    });
    println!("  zstd, new context        {us:6.2} us");
    let mut reused = new_zstd();
    let us = micros_each(|| {
        reused.reinit().expect("reset");
        decode_zstd(&mut reused, &small_zs, &mut out);
    });
    println!("  zstd, reused context     {us:6.2} us");

    println!("\ncompressing a read, 1 MiB pieces (what Accept-Encoding would cost)");
    let pieces: Vec<&[u8]> = data.chunks(1 << 20).collect();
    type Compress<'a> = &'a dyn Fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, Compress); 4] = [
        ("gzip -1", &|d| gzip(d, 1)),
        ("gzip -6", &|d| gzip(d, 6)),
        ("zstd -1", &|d| zstd(d, 1)),
        ("zstd -3", &|d| zstd(d, 3)),
    ];
    for (name, compress) in cases {
        let mut sent = 0;
        let s = best_of(|| sent = pieces.iter().map(|p| compress(p).len()).sum::<usize>());
        println!(
            "  {name}  {:7.0} MB/s  {:5.2} ms CPU per MB  {:4.1}x smaller, saves {:4.1}% of the bytes",
            mb / s,
            s * 1e3 / mb,
            data.len() as f64 / sent as f64,
            100.0 * (1.0 - sent as f64 / data.len() as f64)
        );
    }

    println!("\nfor scale: NDJSON canonicalisation of the same bytes");
    let s = best_of(|| {
        let c = ursula_protocol::json::canonicalize_lines(std::hint::black_box(&data))
            .expect("valid NDJSON");
        std::hint::black_box(c);
    });
    println!(
        "  canonicalize_lines  {:7.0} MB/s  {:5.2} ms CPU per MB",
        mb / s,
        s * 1e3 / mb
    );
}
