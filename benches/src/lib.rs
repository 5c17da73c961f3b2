//! What the ceiling servers (`hello-monoio`, `hello-streams`) share: their command line,
//! one pinned monoio runtime per core with its own `SO_REUSEPORT` listener on a common
//! port, and the `NAME listening on http://ADDR` line once every core accepts.

use std::future::Future;
use std::net::SocketAddr;

use monoio::io::AsyncReadRent;
use monoio::net::{ListenerOpts, TcpListener, TcpStream};

/// `[ADDR] [CORES]` from the command line (default 127.0.0.1:0 and all cores).
pub struct CeilingArgs {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub cores: usize,
}

impl CeilingArgs {
    /// Parse the arguments of server `name`; exits with status 2 on a bad address.
    pub fn parse(name: &'static str) -> CeilingArgs {
        let mut args = std::env::args().skip(1);
        let addr = match args.next().unwrap_or_else(|| "127.0.0.1:0".into()).parse() {
            Ok(a) => a,
            Err(e) => {
                eprintln!("{name}: bad address: {e}");
                std::process::exit(2);
            }
        };
        let cores = args
            .next()
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        CeilingArgs { name, addr, cores }
    }

    /// Run `serve(core, listener)` on every core, each on its own pinned runtime and
    /// listener; prints the listening line once all of them are bound, then runs forever.
    pub fn serve_on_every_core<F, Fut>(self, serve: F)
    where
        F: Fn(usize, TcpListener) -> Fut + Send + Clone + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        // Bind once here to learn the port, then give every core its own listener on it.
        let first = std::net::TcpListener::bind(self.addr).expect("bind");
        let bound = first.local_addr().expect("local addr");
        drop(first);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut threads = Vec::new();
        let cpus = allowed_cpus();
        for core in 0..self.cores {
            let (tx, serve) = (tx.clone(), serve.clone());
            let cpu = cpus[core % cpus.len()];
            threads.push(std::thread::spawn(move || {
                let _ = monoio::utils::bind_to_cpu_set([cpu]);
                // Rings as cooperative as the server's (see its `cooperative_runtime`), so
                // the ceiling is not held back by what the server was spared.
                let mut ring = io_uring::IoUring::builder();
                ring.setup_coop_taskrun();
                let mut rt = monoio::RuntimeBuilder::<monoio::FusionDriver>::new()
                    .with_entries(1024)
                    .uring_builder(ring)
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let opts = ListenerOpts::new().reuse_port(true).reuse_addr(true);
                    let listener = TcpListener::bind_with_config(bound, &opts).expect("bind core");
                    let _ = tx.send(());
                    serve(core, listener).await;
                });
            }));
        }
        for _ in 0..self.cores {
            let _ = rx.recv();
        }
        println!("{} listening on http://{bound}", self.name);
        for t in threads {
            let _ = t.join();
        }
    }
}

/// The CPUs this process was started on, lowest first (its affinity mask: `taskset`), so
/// that a ceiling confined to some CPUs pins its cores inside them. All CPUs if the mask
/// cannot be read.
pub fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap_or_default();
    let mut cpus = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (from, to) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(from), Ok(to)) = (from.parse::<usize>(), to.parse::<usize>()) {
            cpus.extend(from..=to);
        }
    }
    if cpus.is_empty() {
        cpus.extend(0..std::thread::available_parallelism().map_or(1, |n| n.get()));
    }
    cpus
}

/// Append what the socket has to `buf`, reading into the reusable `spare`; false once the
/// peer has closed or the read failed.
pub async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>, spare: &mut Vec<u8>) -> bool {
    let (res, got) = stream.read(std::mem::take(spare)).await;
    buf.extend_from_slice(&got);
    *spare = got;
    spare.clear();
    matches!(res, Ok(n) if n > 0)
}
