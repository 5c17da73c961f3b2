//! The bearer tokens of optional authentication (`auth_token_file`), loaded at start.
//!
//! One file holds every token, one per line, each with its scope: `read:<token>` may
//! GET and HEAD, `write:<token>` may do anything. A line without a prefix is an error
//! rather than a guess at its scope. Blank lines and lines starting with `#` are ignored.
//!
//! Tokens are kept as BLAKE3 digests and a presented token is hashed and compared with
//! every configured digest in constant time, so neither its content nor its length is
//! revealed by timing.

use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

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
    #[error("no tokens")]
    Empty,
}

pub struct Tokens {
    read: Vec<[u8; 32]>,
    write: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tokens({} read, {} write)",
            self.read.len(),
            self.write.len()
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
        let mut tokens = Tokens {
            read: Vec::new(),
            write: Vec::new(),
        };
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (list, token) = if let Some(t) = line.strip_prefix("read:") {
                (&mut tokens.read, t)
            } else if let Some(t) = line.strip_prefix("write:") {
                (&mut tokens.write, t)
            } else {
                return Err(TokenLineError::NoScope(i + 1));
            };
            let token = token.trim();
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(TokenLineError::Weak(i + 1));
            }
            list.push(*blake3::hash(token.as_bytes()).as_bytes());
        }
        if tokens.read.is_empty() && tokens.write.is_empty() {
            return Err(TokenLineError::Empty);
        }
        Ok(tokens)
    }

    /// The scope of a presented token, checked against every configured token.
    pub fn scope(&self, presented: &str) -> Option<Scope> {
        let digest = blake3::hash(presented.as_bytes());
        let digest = digest.as_bytes();
        let any = |list: &[[u8; 32]]| {
            list.iter()
                .fold(subtle::Choice::from(0), |acc, t| acc | t.ct_eq(digest))
        };
        let (write, read) = (any(&self.write), any(&self.read));
        if bool::from(write) {
            Some(Scope::Write)
        } else if bool::from(read) {
            Some(Scope::Read)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_scope() {
        let t = Tokens::parse("# ops\nread:rrrrrrrrrrrrrrrr\n\nwrite: wwwwwwwwwwwwwwww \n")
            .expect("parse");
        assert_eq!(t.scope("rrrrrrrrrrrrrrrr"), Some(Scope::Read));
        assert_eq!(t.scope("wwwwwwwwwwwwwwww"), Some(Scope::Write));
        assert_eq!(t.scope("wwwwwwwwwwwwwwwx"), None);
        assert_eq!(t.scope(""), None);
        let refused = |text| Tokens::parse(text).err();
        assert_eq!(
            refused("\nbare-token-without-scope\n"),
            Some(TokenLineError::NoScope(2))
        );
        assert_eq!(refused("read:short\n"), Some(TokenLineError::Weak(1)));
        assert_eq!(refused("# nothing\n"), Some(TokenLineError::Empty));
        assert!(!format!("{t:?}").contains("rrrr"));
    }
}
