//! Standard output: buffered, its failures typed, tables for people and JSON for scripts.

use std::io::{BufWriter, StdoutLock, Write};

use serde::Serialize;

use crate::error::Error;

/// The command's standard output. Buffered: a reader of a live stream calls
/// [`Out::flush`] after each batch, so what arrived is shown at once.
pub struct Out {
    writer: BufWriter<StdoutLock<'static>>,
}

impl Out {
    pub fn stdout() -> Out {
        Out {
            writer: BufWriter::with_capacity(64 * 1024, std::io::stdout().lock()),
        }
    }

    pub fn bytes(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.writer.write_all(bytes).map_err(Error::Stdout)
    }

    pub fn line(&mut self, text: &str) -> Result<(), Error> {
        self.bytes(text.as_bytes())?;
        self.bytes(b"\n")
    }

    /// One JSON value on one line.
    pub fn json(&mut self, value: &impl Serialize) -> Result<(), Error> {
        let text = sonic_rs::to_string(value)
            .map_err(|e| Error::Stdout(std::io::Error::other(e.to_string())))?;
        self.line(&text)
    }

    pub fn flush(&mut self) -> Result<(), Error> {
        self.writer.flush().map_err(Error::Stdout)
    }
}

/// Rows under a header, in columns as wide as their widest cell; the columns `numeric`
/// names are right-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>], numeric: &[usize]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    let mut out = String::new();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = " ".repeat(width - cell.chars().count());
            if numeric.contains(&i) {
                line.push_str(&pad);
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&pad);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A Unix time in milliseconds as RFC 3339 in UTC (`2026-07-18T07:30:00.000Z`).
pub fn time(unix_ms: i64) -> String {
    ursula_protocol::headers::format_rfc3339_millis(unix_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let rows = vec![
            vec!["logs".to_string(), "12".to_string()],
            vec!["telemetry".to_string(), "3".to_string()],
        ];
        assert_eq!(
            table(&["BUCKET", "STREAMS"], &rows, &[1]),
            "BUCKET     STREAMS\nlogs            12\ntelemetry        3\n"
        );
        assert_eq!(table(&["A", "B"], &[], &[]), "A  B\n");
    }

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(1_784_370_600_000), "2026-07-18T10:30:00.000Z");
    }
}
