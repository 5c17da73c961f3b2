//! The bearer tokens of optional authentication (`auth_token_file`), loaded at start and
//! again on SIGHUP.
//!
//! One file holds every token, one per line, each with its access: `read:<token>` may
//! GET and HEAD, `write:<token>` may do anything. A line without a prefix is an error
//! rather than a guess at its access. After the token, `buckets=` may limit it to some
//! buckets, by name or by prefix (`tenant-a-*`), comma-separated; such a token sees
//! nothing else. Blank lines and lines starting with `#` are ignored.
//!
//! Tokens are kept as BLAKE3 digests and a presented token is hashed and compared with
//! every configured digest in constant time, so neither its content nor its length is
//! revealed by timing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read auth token file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("auth token file {}: {why}", path.display())]
    Invalid { path: PathBuf, why: TokenLineError },
}

/// What is wrong inside a token file.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenLineError {
    #[error("line {0}: expected read:<token> or write:<token>")]
    NoScope(usize),
    #[error("line {0}: a token is at least 16 printable characters without spaces")]
    Weak(usize),
    #[error("line {0}: after the token only buckets=<name>,<prefix>*,... may follow")]
    Trailing(usize),
    #[error(
        "line {0}: buckets= takes bucket names (4-64 of a-z, 0-9, _ and -) or prefixes ending in *"
    )]
    BadBucket(usize),
    #[error("line {0}: the same token is on line {1}")]
    Repeated(usize, usize),
    #[error("no tokens")]
    Empty,
}

/// The token file, as last loaded: read on every request, replaced by [`TokenFile::reload`].
/// Each core keeps the `Tokens` it last used and compares `generation` before each use, so
/// a request takes no lock and touches no reference count another core writes.
pub struct TokenFile {
    path: PathBuf,
    generation: AtomicU64,
    current: Mutex<Arc<Tokens>>,
}

impl std::fmt::Debug for TokenFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenFile({})", self.path.display())
    }
}

impl TokenFile {
    pub fn load(path: &Path) -> Result<TokenFile, TokenFileError> {
        Ok(TokenFile {
            path: path.to_path_buf(),
            generation: AtomicU64::new(0),
            current: Mutex::new(Arc::new(Tokens::load(path)?)),
        })
    }

    /// Read the file again. A file that cannot be used changes nothing: the tokens loaded
    /// before stay in force, and the error says why.
    pub fn reload(&self) -> Result<&Path, TokenFileError> {
        let tokens = Tokens::load(&self.path)?;
        *self.lock() = Arc::new(tokens);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(&self.path)
    }

    /// Changes with every successful reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn current(&self) -> Arc<Tokens> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Arc<Tokens>> {
        // Replacing an `Arc` cannot be left half-done by a panicking holder.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub struct Tokens {
    entries: Vec<Entry>,
}

/// One configured token.
struct Entry {
    digest: [u8; 32],
    grant: Grant,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let read = self
            .entries
            .iter()
            .filter(|e| e.grant.access == Scope::Read)
            .count();
        write!(
            f,
            "Tokens({} read, {} write)",
            read,
            self.entries.len() - read
        )
    }
}

/// What a token may do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scope {
    /// GET and HEAD.
    Read,
    /// Anything.
    Write,
}

/// What a token is granted: its access, and the buckets it is limited to (`None`: all of
/// them, and the compat surface).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub access: Scope,
    pub buckets: Option<Arc<BucketScope>>,
}

/// The buckets a token is limited to: exact names and prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct BucketScope {
    names: Vec<String>,
    prefixes: Vec<String>,
}

impl BucketScope {
    pub fn allows(&self, bucket: &str) -> bool {
        self.names.iter().any(|n| n == bucket)
            || self.prefixes.iter().any(|p| bucket.starts_with(p.as_str()))
    }

    /// `buckets=` patterns, comma-separated; `None` if one is not a bucket name or prefix.
    fn parse(list: &str) -> Option<BucketScope> {
        let mut scope = BucketScope::default();
        for pattern in list.split(',') {
            let (name, prefix) = match pattern.strip_suffix('*') {
                Some(p) => (p, true),
                None => (pattern, false),
            };
            let chars_ok = name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
            let len_ok = if prefix {
                name.len() <= 64
            } else {
                (4..=64).contains(&name.len())
            };
            if !chars_ok || !len_ok || name.starts_with("__") {
                return None;
            }
            if prefix {
                scope.prefixes.push(name.to_string());
            } else {
                scope.names.push(name.to_string());
            }
        }
        Some(scope)
    }
}

impl Tokens {
    pub fn load(path: &Path) -> Result<Tokens, TokenFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokenFileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Tokens::parse(&text).map_err(|why| TokenFileError::Invalid {
            path: path.to_path_buf(),
            why,
        })
    }

    fn parse(text: &str) -> Result<Tokens, TokenLineError> {
        let mut entries: Vec<(usize, Entry)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (access, rest) = if let Some(t) = line.strip_prefix("read:") {
                (Scope::Read, t)
            } else if let Some(t) = line.strip_prefix("write:") {
                (Scope::Write, t)
            } else {
                return Err(TokenLineError::NoScope(n));
            };
            let mut words = rest.split_ascii_whitespace();
            let token = words.next().unwrap_or("");
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TokenLineError::Weak(n));
            }
            let buckets = match words.next() {
                None => None,
                Some(w) => {
                    let list = w
                        .strip_prefix("buckets=")
                        .ok_or(TokenLineError::Trailing(n))?;
                    let scope = BucketScope::parse(list).ok_or(TokenLineError::BadBucket(n))?;
                    Some(Arc::new(scope))
                }
            };
            if words.next().is_some() {
                return Err(TokenLineError::Trailing(n));
            }
            let digest = *blake3::hash(token.as_bytes()).as_bytes();
            // Two lines for one token would grant whichever one a lookup met first.
            if let Some((first, _)) = entries.iter().find(|(_, e)| e.digest == digest) {
                return Err(TokenLineError::Repeated(n, *first));
            }
            entries.push((
                n,
                Entry {
                    digest,
                    grant: Grant { access, buckets },
                },
            ));
        }
        if entries.is_empty() {
            return Err(TokenLineError::Empty);
        }
        Ok(Tokens {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
        })
    }

    /// The grant of a presented token, compared with every configured token in constant
    /// time.
    pub fn grant(&self, presented: &str) -> Option<&Grant> {
        let digest = blake3::hash(presented.as_bytes());
        let digest = digest.as_bytes();
        let mut found = u32::MAX;
        for (i, e) in self.entries.iter().enumerate() {
            found.conditional_assign(&(i as u32), e.digest.ct_eq(digest));
        }
        self.entries.get(found as usize).map(|e| &e.grant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(t: &Tokens, presented: &str) -> Option<Scope> {
        t.grant(presented).map(|g| g.access)
    }

    #[test]
    fn parse_and_scope() {
        let t = Tokens::parse("# ops\nread:rrrrrrrrrrrrrrrr\n\nwrite: wwwwwwwwwwwwwwww \n")
            .expect("parse");
        assert_eq!(access(&t, "rrrrrrrrrrrrrrrr"), Some(Scope::Read));
        assert_eq!(access(&t, "wwwwwwwwwwwwwwww"), Some(Scope::Write));
        assert_eq!(access(&t, "wwwwwwwwwwwwwwwx"), None);
        assert_eq!(access(&t, ""), None);
        assert!(t
            .grant("rrrrrrrrrrrrrrrr")
            .is_some_and(|g| g.buckets.is_none()));
        let refused = |text| Tokens::parse(text).err();
        assert_eq!(
            refused("\nbare-token-without-scope\n"),
            Some(TokenLineError::NoScope(2))
        );
        assert_eq!(refused("read:short\n"), Some(TokenLineError::Weak(1)));
        assert_eq!(refused("# nothing\n"), Some(TokenLineError::Empty));
        assert!(!format!("{t:?}").contains("rrrr"));
    }

    #[test]
    fn buckets_limit_a_token() {
        let t = Tokens::parse(
            "write:aaaaaaaaaaaaaaaa buckets=logs,tenant-a-*\nread:bbbbbbbbbbbbbbbb buckets=*\n",
        )
        .expect("parse");
        let a = t.grant("aaaaaaaaaaaaaaaa").and_then(|g| g.buckets.clone());
        let a = a.expect("limited");
        assert!(a.allows("logs"));
        assert!(!a.allows("logs2"));
        assert!(a.allows("tenant-a-web"));
        assert!(!a.allows("tenant-b-web"));
        let b = t.grant("bbbbbbbbbbbbbbbb").and_then(|g| g.buckets.clone());
        assert!(b.expect("limited").allows("anything"));
        fn refused(text: &str) -> Option<TokenLineError> {
            Tokens::parse(text).err()
        }
        assert_eq!(
            refused("read:aaaaaaaaaaaaaaaa logs\n"),
            Some(TokenLineError::Trailing(1))
        );
        assert_eq!(
            refused("read:aaaaaaaaaaaaaaaa buckets=logs extra\n"),
            Some(TokenLineError::Trailing(1))
        );
        for bad in [
            "buckets=",
            "buckets=ab",
            "buckets=Logs",
            "buckets=lo*gs",
            "buckets=__x*",
        ] {
            assert_eq!(
                refused(&format!("read:aaaaaaaaaaaaaaaa {bad}\n")),
                Some(TokenLineError::BadBucket(1)),
                "{bad}"
            );
        }
        assert_eq!(
            refused("read:aaaaaaaaaaaaaaaa\nwrite:aaaaaaaaaaaaaaaa\n"),
            Some(TokenLineError::Repeated(2, 1))
        );
    }
}
