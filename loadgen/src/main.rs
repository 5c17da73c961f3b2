//! `ursula-loadgen`: load generator for any Durable Streams server.
//!
//! Thread-per-core: `--cores N` threads, each pinned to one CPU and running its own monoio
//! event loop with its own keep-alive HTTP/1.1 connections. Per-core results (hdrhistogram
//! latencies, counters, errors by status) are merged at the end into a human summary on
//! stdout and, with `--json FILE`, a machine-readable report.

mod append_max;
mod batch;
mod common;
mod fanout;
mod head;
mod http;
mod progress;
mod read;
mod replay;
mod seek;
mod stats;
mod svg;
mod tail;
mod verify;
mod write;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use common::{available_cores, Common, Target};
use stats::{Check, Report, Stats};

#[derive(Parser, Debug)]
#[command(
    name = "ursula-loadgen",
    version,
    about = "Load generator for Durable Streams servers"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// N streams, one closed-loop writer each, or a fixed offered load (`--rate`):
    /// appends/s, MB/s, append latency.
    Write(write::WriteArgs),
    /// Catch-up reads of pre-filled streams following Stream-Next-Offset.
    Read(read::ReadArgs),
    /// Write known payloads, read everything back, compare byte-exact (exit 1 on mismatch).
    Verify(verify::VerifyArgs),
    /// Appends near the 32 MiB request limit; confirms limit + 1 byte is refused with 413.
    AppendMax(append_max::AppendMaxArgs),
    /// Long-poll tailing: publish-to-receive latency of timestamped events.
    Tail(tail::TailArgs),
    /// N clients each replaying its own pre-filled stream: time to full replay.
    Replay(replay::ReplayArgs),
    /// Closed-loop HEAD requests: metadata requests/s and latency.
    Head(head::HeadArgs),
    /// Random reads of old offsets in existing streams (e.g. an earlier `write` run's).
    Seek(seek::SeekArgs),
    /// Small JSON events per request: append-batch frames (bucketed) or JSON arrays (compat).
    Batch(batch::BatchArgs),
    /// One writer at a fixed rate, N SSE subscribers: publish-to-receive latency.
    Fanout(fanout::FanoutArgs),
    /// Overlay the latency curves of several `--json` reports in one SVG chart.
    Chart(ChartArgs),
}

#[derive(Args, Debug)]
struct ChartArgs {
    /// Output SVG file.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Chart title.
    #[arg(long, default_value = "latency distribution")]
    title: String,
    /// Reports as LABEL=FILE (a `--json` report of any scenario).
    #[arg(required = true)]
    reports: Vec<String>,
}

/// What a scenario hands back for the report.
pub struct Outcome {
    pub stats: Stats,
    pub op: &'static str,
    pub latency_of: &'static str,
    pub checks: Vec<Check>,
    /// Length of the measured window.
    pub window: Duration,
    /// Warm-up that preceded it (zero for count-based scenarios).
    pub warmup: Duration,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tail::init_clock();
    match run(cli.scenario) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ursula-loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(scenario: Scenario) -> Result<bool, String> {
    let (name, common, params): (&str, Common, sonic_rs::Value) = match &scenario {
        Scenario::Chart(a) => return chart(a).map(|()| true),
        Scenario::Write(a) => ("write", a.common.clone(), to_value(a)?),
        Scenario::Read(a) => ("read", a.common.clone(), to_value(a)?),
        Scenario::Verify(a) => ("verify", a.common.clone(), to_value(a)?),
        Scenario::AppendMax(a) => ("append-max", a.common.clone(), to_value(a)?),
        Scenario::Tail(a) => ("tail", a.common.clone(), to_value(a)?),
        Scenario::Replay(a) => ("replay", a.common.clone(), to_value(a)?),
        Scenario::Head(a) => ("head", a.common.clone(), to_value(a)?),
        Scenario::Seek(a) => ("seek", a.common.clone(), to_value(a)?),
        Scenario::Batch(a) => ("batch", a.common.clone(), to_value(a)?),
        Scenario::Fanout(a) => ("fanout", a.common.clone(), to_value(a)?),
    };
    let target = Target::from_common(&common)?;
    let _ = common::PIN_TO.set(common.cpus.clone());
    if let Some(path) = &common.window_marks {
        let _ = common::WINDOW_MARKS.set(path.clone());
    }
    let default_cores = match common.cpus.len() {
        0 => available_cores(),
        n => n,
    };
    let cores = common.cores.unwrap_or(default_cores).max(1);
    let outcome = match &scenario {
        Scenario::Write(a) => write::run(a, &target, cores)?,
        Scenario::Read(a) => read::run(a, &target, cores)?,
        Scenario::Verify(a) => verify::run(a, &target, cores)?,
        Scenario::AppendMax(a) => append_max::run(a, &target, cores)?,
        Scenario::Tail(a) => tail::run(a, &target, cores)?,
        Scenario::Replay(a) => replay::run(a, &target, cores)?,
        Scenario::Head(a) => head::run(a, &target, cores)?,
        Scenario::Seek(a) => seek::run(a, &target, cores)?,
        Scenario::Batch(a) => batch::run(a, &target, cores)?,
        Scenario::Fanout(a) => fanout::run(a, &target, cores)?,
        Scenario::Chart(_) => unreachable!("handled above"),
    };
    let report = build_report(name, &common, &target, cores, params, outcome);
    print!("{}", report.human());
    if let Some(path) = &common.json {
        let text =
            sonic_rs::to_string_pretty(&report).map_err(|e| format!("encode report: {e}"))?;
        std::fs::write(path, text + "\n").map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    if let Some(path) = &common.svg {
        let title = format!("{name}: {} ({})", report.latency_of, report.target);
        let series = svg::Series {
            label: report.target.clone(),
            points: report.latency.curve.clone(),
        };
        std::fs::write(path, svg::render(&title, &[series]))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    Ok(report.ok)
}

fn chart(a: &ChartArgs) -> Result<(), String> {
    let mut series = Vec::new();
    for spec in &a.reports {
        let (label, file) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec}: expected LABEL=FILE"))?;
        let text = std::fs::read_to_string(file).map_err(|e| format!("read {file}: {e}"))?;
        let report: sonic_rs::Value =
            sonic_rs::from_str(&text).map_err(|e| format!("{file}: not a JSON report: {e}"))?;
        let curve = sonic_rs::JsonValueTrait::pointer(&report, &["latency", "curve"])
            .and_then(|c| sonic_rs::from_str::<Vec<(f64, f64)>>(&c.to_string()).ok())
            .ok_or_else(|| format!("{file}: no latency.curve"))?;
        series.push(svg::Series {
            label: label.to_string(),
            points: curve,
        });
    }
    std::fs::write(&a.out, svg::render(&a.title, &series))
        .map_err(|e| format!("write {}: {e}", a.out.display()))
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<sonic_rs::Value, String> {
    sonic_rs::to_value(v).map_err(|e| format!("encode parameters: {e}"))
}

fn build_report(
    scenario: &str,
    common: &Common,
    target: &Target,
    cores: usize,
    parameters: sonic_rs::Value,
    o: Outcome,
) -> Report {
    let secs = o.window.as_secs_f64().max(1e-9);
    let mut st = o.stats;
    let error_total = st.error_total();
    let ok = o.checks.iter().all(|c| c.passed);
    Report {
        scenario: scenario.to_string(),
        target: target.base.clone(),
        surface: match common.surface {
            common::Surface::Compat => "compat".into(),
            common::Surface::Bucketed => "bucketed".into(),
        },
        cores,
        parameters,
        warmup_s: o.warmup.as_secs_f64(),
        duration_s: o.window.as_secs_f64(),
        op: o.op.to_string(),
        ops: st.ops,
        ops_per_sec: st.ops as f64 / secs,
        requests: st.requests,
        bytes: st.bytes,
        mb_per_sec: st.bytes as f64 / secs / 1e6,
        client_cpu_us_per_op: common::cpu::over_window()
            .filter(|_| st.ops > 0)
            .map(|cpu| cpu.as_secs_f64() * 1e6 / st.ops as f64),
        latency_of: o.latency_of.to_string(),
        latency: st.latencies.summary(),
        non_2xx: st.non_2xx(),
        errors: st.errors,
        error_total,
        counters: st
            .counters
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        checks: o.checks,
        ok,
    }
}
