//! `ursula-test-s3` for the tests that need S3: s3s-fs with serialised writes on a loopback
//! port, its objects files under a directory.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;

use super::URSULA_BIN;

pub const BUCKET: &str = "cold-test";
pub const CREDS: [(&str, &str); 3] = [
    ("AWS_ACCESS_KEY_ID", "testak"),
    ("AWS_SECRET_ACCESS_KEY", "testsecretkey"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];
/// `ursula-test-s3`, built next to `ursula` by the workspace build.
pub fn test_s3_bin() -> PathBuf {
    let p = Path::new(URSULA_BIN).with_file_name("ursula-test-s3");
    assert!(
        p.exists(),
        "{} not found: the cold tier tests need the S3 test server; build the workspace \
         first (cargo build --release --workspace)",
        p.display()
    );
    p
}

/// A running S3 server whose objects are files under `root/BUCKET/`.
pub struct S3 {
    child: Child,
    pub addr: String,
    pub root: PathBuf,
}

impl S3 {
    pub fn start(root: &Path, port: u16) -> S3 {
        S3::start_with(root, port, &[])
    }

    /// [`S3::start`] with more `ursula-test-s3` arguments (`--put-delay-ms 80`).
    pub fn start_with(root: &Path, port: u16, extra: &[&str]) -> S3 {
        std::fs::create_dir_all(root).expect("mkdir s3 root");
        let mut child = Command::new(test_s3_bin())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--root"])
            .arg(root)
            .args(["--bucket", BUCKET])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ursula-test-s3");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        let mut reader = BufReader::new(stdout);
        reader.read_line(&mut line).expect("listening line");
        thread::spawn(move || for _ in reader.lines() {});
        let addr = line
            .trim()
            .strip_prefix("ursula-test-s3 listening on http://")
            .unwrap_or_else(|| panic!("unexpected line from ursula-test-s3: {line:?}"))
            .to_string();
        S3 {
            child,
            addr,
            root: root.to_path_buf(),
        }
    }

    pub fn port(&self) -> u16 {
        self.addr
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .expect("port")
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The object `key` under `prefix`, read from the server's files.
    pub fn object(&self, prefix: &str, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(BUCKET).join(prefix).join(key)).ok()
    }

    pub fn manifest(&self, prefix: &str, shard: u32) -> Option<sonic_rs::Value> {
        let b = self.object(prefix, &format!("shard-{shard}/manifest.json"))?;
        Some(sonic_rs::from_slice(&b).expect("manifest is JSON"))
    }

    pub fn stop(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
