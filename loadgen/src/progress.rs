//! A live progress line on stderr while a scenario runs, only when stderr is a terminal
//! (scripts and CI logs stay quiet).

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::stats::RECORDED;

pub struct Progress {
    running: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
}

impl Progress {
    /// Start the progress line if stderr is a terminal.
    pub fn start() -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress { running: None };
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let bar = ProgressBar::new_spinner();
            if let Ok(style) = ProgressStyle::with_template("{spinner} {elapsed_precise} {msg}") {
                bar.set_style(style);
            }
            let started = Instant::now();
            let (mut last, mut last_at) = (RECORDED.load(Ordering::Relaxed), started);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                let now = Instant::now();
                let done = RECORDED.load(Ordering::Relaxed);
                let rate = (done - last) as f64 / now.duration_since(last_at).as_secs_f64();
                (last, last_at) = (done, now);
                bar.set_message(format!("{done} ops recorded, {rate:.0}/s"));
                bar.tick();
            }
            bar.finish_and_clear();
        });
        Progress {
            running: Some((stop, handle)),
        }
    }

    pub fn finish(self) {
        if let Some((stop, handle)) = self.running {
            stop.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
    }
}
