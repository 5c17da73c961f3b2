//! JSON mode (P§6.2, §11.4): validation, one-level flattening and canonical NDJSON.
//!
//! Canonical form is the input text minus insignificant whitespace, plus LF per
//! message. Nothing is re-serialised, so number lexemes, escapes and string contents
//! survive byte-for-byte.

use memchr::memchr_iter;

/// Nesting bound (serde_json's default too); deeper input is `Invalid`.
pub const MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Canonical {
    /// Concatenated canonical messages, each minified JSON followed by `b'\n'`.
    pub bytes: Vec<u8>,
    /// Length of every message in `bytes`, including its trailing LF.
    pub message_lens: Vec<u32>,
}

impl Canonical {
    pub fn message_count(&self) -> usize {
        self.message_lens.len()
    }

    /// Iterates the messages (each including its trailing LF).
    pub fn messages(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let mut at = 0usize;
        self.message_lens.iter().map(move |&len| {
            let start = at;
            at += len as usize;
            &self.bytes[start..at]
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonError {
    /// Not exactly one valid JSON text (or nested deeper than [`MAX_DEPTH`], or a
    /// single message of 4 GiB or more).
    Invalid,
    /// The body was `[]` where that is not allowed (POST).
    EmptyArray,
}

/// Validates `body` (RFC 8259, UTF-8, no BOM) and splits it into canonical messages.
///
/// A top-level array is flattened exactly one level; `[]` yields
/// [`JsonError::EmptyArray`] unless `allow_empty_array` (PUT), in which case it yields
/// zero messages.
///
/// Validation is a hand-written iterative grammar check fused with minification, so
/// the body is scanned once. sonic-rs (the obvious validator) skips values
/// recursively with ~50 KiB frames in debug builds and overflowed a 2 MiB stack at
/// fewer than 40 nesting levels; the tests use it as a differential oracle instead.
pub fn canonicalize(body: &[u8], allow_empty_array: bool) -> Result<Canonical, JsonError> {
    // UTF-8 is checked per string (`Scanner::string`): non-ASCII bytes anywhere else are
    // grammar errors, and quotes and backslashes never occur inside a multi-byte sequence.
    // An emitting scan only ever stops with `Stop::Invalid`.
    let out = Scanner::<true>::new(body)
        .run()
        .map_err(|_| JsonError::Invalid)?;
    if out.message_lens.is_empty() && !allow_empty_array {
        return Err(JsonError::EmptyArray);
    }
    Ok(out)
}

/// Canonical messages left in the body they came from: `body[range]` holds them, in order,
/// each `message_lens[i]` bytes including its LF.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InPlace {
    pub range: std::ops::Range<usize>,
    pub message_lens: Vec<u32>,
}

/// [`canonicalize`] without a copy, for the common telemetry body: a top-level array with
/// no whitespace inside it (whitespace before `[` and after `]` is fine). Its canonical
/// form is the body itself with the brackets dropped and each depth-1 `,` and the closing
/// `]` turned into LF, so only those bytes are rewritten.
///
/// `Ok(None)` means the body is not such an array: run [`canonicalize`] instead (which
/// also gives the error if the body is invalid after all). An `Err` is the same verdict
/// [`canonicalize`] would give. `body` is changed only on `Ok(Some(_))`.
pub fn canonicalize_in_place(
    body: &mut [u8],
    allow_empty_array: bool,
) -> Result<Option<InPlace>, JsonError> {
    let lens = match Scanner::<false>::new(body).run() {
        Ok(out) => out.message_lens,
        Err(Stop::NotCompact) => return Ok(None),
        Err(Stop::Invalid) => return Err(JsonError::Invalid),
    };
    // The scan accepted a top-level array, so the first byte that is not whitespace is
    // its `[`; the messages start right after it.
    let start = body.iter().position(|&c| !is_ws(c)).map_or(0, |at| at + 1);
    if lens.is_empty() && !allow_empty_array {
        return Err(JsonError::EmptyArray);
    }
    let mut end = start;
    for &len in &lens {
        end += len as usize;
        // The message's separator: `,` between elements, `]` after the last one.
        body[end - 1] = b'\n';
    }
    Ok(Some(InPlace {
        range: start..end,
        message_lens: lens,
    }))
}

/// Why an NDJSON body was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinesError {
    /// Line `line` (counted from 1, empty lines included) is not exactly one JSON text.
    Invalid { line: usize },
    /// No line holds a value.
    Empty,
}

impl std::fmt::Display for LinesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinesError::Invalid { line } => write!(f, "line {line} is not a JSON value"),
            LinesError::Empty => f.write_str("no line holds a JSON value"),
        }
    }
}

impl std::error::Error for LinesError {}

/// Validates an NDJSON body and canonicalises it: every line that holds anything but
/// whitespace is one message, checked and minified exactly like a body of one value (so a
/// line holding an array is one message, not flattened: one line, one record). Lines end
/// at LF; a CR before it is whitespace. Lines holding only whitespace are skipped.
///
/// A JSON text never holds a raw LF inside a string, so cutting at every LF cannot split a
/// value that belongs on one line. One scanner runs over every line in turn, so the output
/// and the nesting stack are allocated once per body, not once per line.
pub fn canonicalize_lines(body: &[u8]) -> Result<Canonical, LinesError> {
    let mut scanner = Scanner::<true>::new(body);
    scanner.split_array = false;
    let mut start = 0;
    let ends = memchr_iter(b'\n', body).chain(std::iter::once(body.len()));
    for (at, end) in ends.enumerate() {
        let line = &body[start..end];
        start = end + 1;
        if line.iter().all(|&c| is_ws(c)) {
            continue;
        }
        scanner.b = line;
        scanner.i = 0;
        scanner.msg_start = scanner.out.len();
        scanner.stack.clear();
        scanner
            .scan()
            .map_err(|_| LinesError::Invalid { line: at + 1 })?;
    }
    if scanner.lens.is_empty() {
        return Err(LinesError::Empty);
    }
    Ok(Canonical {
        bytes: scanner.out,
        message_lens: scanner.lens,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A value is required (after `:`, after `,` in an array, at the top).
    Value,
    /// Just after `[`: a value or `]`.
    ValueOrEnd,
    /// Just after `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object.
    Key,
    Colon,
    CommaOrEnd,
    /// The top-level value is complete; only whitespace may follow.
    Done,
}

/// Why a scan stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Invalid,
    /// The in-place scan (`EMIT = false`) met what it cannot rewrite in place.
    NotCompact,
}

impl From<JsonError> for Stop {
    fn from(_: JsonError) -> Stop {
        Stop::Invalid
    }
}

/// The grammar check, fused with minification into `out` when `EMIT`. Without `EMIT` it
/// only validates and measures messages, and accepts only what [`canonicalize_in_place`]
/// can rewrite: a top-level array with no whitespace inside.
struct Scanner<'a, const EMIT: bool> {
    b: &'a [u8],
    i: usize,
    out: Vec<u8>,
    lens: Vec<u32>,
    /// Where the current message starts: in `out` when `EMIT`, in `b` otherwise.
    msg_start: usize,
    /// Open containers, `b'['` or `b'{'`, outermost first.
    stack: Vec<u8>,
    /// Top-level value is an array whose elements become the messages.
    flatten: bool,
    /// Whether a top-level array is split into its elements (a body), or is one message
    /// like any other value (a line of NDJSON).
    split_array: bool,
}

fn is_ws(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// How far ahead of the scan [`prefetch`] asks for the body. A request body has usually
/// left L2 by the time its scan starts (other connections' bodies arrived meanwhile), and
/// the hardware prefetcher stops at every 4 KiB page, so without this the string scan
/// waits on memory: 3.9 GB/s against 7.0 GB/s with it on bodies that are not in cache
/// (`cargo bench -p ursula-benches --bench json`).
const PREFETCH_AHEAD: usize = 1024;

/// Hints the CPU to start loading the cache line holding `b[at]`, if `at` is in `b`.
#[inline(always)]
fn prefetch(b: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    if at < b.len() {
        let line = b[at..].as_ptr().cast::<i8>();
        // SAFETY: `_mm_prefetch` is unsafe only because it is a `#[target_feature(enable =
        // "sse")]` function, and SSE is part of the x86_64 baseline, so every CPU this
        // code runs on has it. The instruction is a hint: it reads nothing into the
        // program, never faults, and `line` points into `b` anyway.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line)
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (b, at);
}

/// Skips string content holding no quote, backslash or control character. Returns where
/// the byte-wise scan must resume (at most 7 bytes before the first special byte) and
/// whether a skipped byte was non-ASCII. String bodies are most of a telemetry event's
/// bytes; a byte-at-a-time loop plus a separate UTF-8 pass over them were half of a large
/// JSON batch's server CPU.
fn skip_plain(b: &[u8], mut i: usize) -> (usize, bool) {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const SPACES: u64 = u64::from_ne_bytes([0x20; 8]);
    // A byte's high bit ends up set where the byte is zero (`w ^ pattern` zeroes a match)
    // or below 0x20; a borrow can also flag bytes above a real match, which only sends the
    // word to the byte loop.
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut high = 0u64;
    // Whole 64-byte blocks first, written so the compiler turns each into a few vector
    // compares; the word loop below finds where inside the last block the scan stops.
    const BLOCK: usize = 64;
    while let Some(block) = b.get(i..i + BLOCK) {
        let Ok(block) = <&[u8; BLOCK]>::try_from(block) else {
            break;
        };
        prefetch(b, i + PREFETCH_AHEAD);
        let mut special = 0u8;
        let mut any_high = 0u8;
        for &c in block {
            special |= u8::from(c == b'"') | u8::from(c == b'\\') | u8::from(c < 0x20);
            any_high |= c;
        }
        if special != 0 {
            break;
        }
        high |= u64::from(any_high);
        i += BLOCK;
    }
    while let Some(word) = b.get(i..i + 8) {
        let Ok(word) = <[u8; 8]>::try_from(word) else {
            break;
        };
        let w = u64::from_ne_bytes(word);
        let special = zero_bytes(w ^ QUOTES)
            | zero_bytes(w ^ BACKSLASHES)
            | (w.wrapping_sub(SPACES) & !w & HIGHS);
        if special != 0 {
            break;
        }
        high |= w;
        i += 8;
    }
    (i, high & HIGHS != 0)
}

impl<'a, const EMIT: bool> Scanner<'a, EMIT> {
    fn new(b: &'a [u8]) -> Self {
        Scanner {
            b,
            i: 0,
            out: if EMIT {
                Vec::with_capacity(b.len() + 1)
            } else {
                Vec::new()
            },
            lens: Vec::new(),
            msg_start: 0,
            stack: Vec::new(),
            flatten: false,
            split_array: true,
        }
    }

    fn emit(&mut self, c: u8) {
        if EMIT {
            self.out.push(c);
        }
    }

    fn emit_slice(&mut self, from: usize, to: usize) {
        if EMIT {
            self.out.extend_from_slice(&self.b[from..to]);
        }
    }

    fn run(mut self) -> Result<Canonical, Stop> {
        self.scan()?;
        Ok(Canonical {
            bytes: self.out,
            message_lens: self.lens,
        })
    }

    /// Scan `b` from `i` as one JSON text, adding its messages to `out` and `lens`.
    fn scan(&mut self) -> Result<(), Stop> {
        const BAD: Result<(), Stop> = Err(Stop::Invalid);
        let mut expect = Expect::Value;
        let n = self.b.len();
        while self.i < n {
            let c = self.b[self.i];
            if is_ws(c) {
                if !EMIT && !self.stack.is_empty() {
                    return Err(Stop::NotCompact);
                }
                self.i += 1;
                continue;
            }
            expect = match (expect, c) {
                (Expect::Done, _) => return BAD,
                (Expect::Value | Expect::ValueOrEnd, b'[' | b'{') => {
                    if self.stack.is_empty() && c == b'[' && self.split_array {
                        // The outer array's brackets belong to no message.
                        self.flatten = true;
                        self.msg_start = if EMIT { 0 } else { self.i + 1 };
                    } else if !EMIT && self.stack.is_empty() {
                        // A lone value needs a byte more (its LF) than the body has.
                        return Err(Stop::NotCompact);
                    } else {
                        self.emit(c);
                    }
                    self.stack.push(c);
                    if self.stack.len() > MAX_DEPTH {
                        return BAD;
                    }
                    self.i += 1;
                    if c == b'[' {
                        Expect::ValueOrEnd
                    } else {
                        Expect::KeyOrEnd
                    }
                }
                (Expect::ValueOrEnd | Expect::CommaOrEnd, b']')
                | (Expect::KeyOrEnd | Expect::CommaOrEnd, b'}') => {
                    let open = if c == b']' { b'[' } else { b'{' };
                    if self.stack.pop() != Some(open) {
                        return BAD;
                    }
                    if !(self.flatten && self.stack.is_empty()) {
                        self.emit(c);
                    }
                    self.i += 1;
                    self.value_done()?
                }
                (Expect::CommaOrEnd, b',') => {
                    // Depth-1 commas of the outer array separate messages.
                    if !(self.flatten && self.stack.len() == 1) {
                        self.emit(b',');
                    }
                    self.i += 1;
                    if self.stack.last() == Some(&b'{') {
                        Expect::Key
                    } else {
                        Expect::Value
                    }
                }
                (Expect::Colon, b':') => {
                    self.emit(b':');
                    self.i += 1;
                    Expect::Value
                }
                (Expect::Key | Expect::KeyOrEnd, b'"') => {
                    self.string()?;
                    Expect::Colon
                }
                (Expect::Value | Expect::ValueOrEnd, _) => {
                    if !EMIT && self.stack.is_empty() {
                        return Err(Stop::NotCompact);
                    }
                    match c {
                        b'"' => self.string()?,
                        b'-' | b'0'..=b'9' => self.number()?,
                        b't' => self.literal(b"true")?,
                        b'f' => self.literal(b"false")?,
                        b'n' => self.literal(b"null")?,
                        _ => return BAD,
                    }
                    self.value_done()?
                }
                _ => return BAD,
            };
        }
        if expect != Expect::Done {
            return BAD;
        }
        Ok(())
    }

    /// A value just ended: cut a message if it was a message-level value.
    fn value_done(&mut self) -> Result<Expect, JsonError> {
        let depth = self.stack.len();
        if (self.flatten && depth == 1) || (!self.flatten && depth == 0) {
            // Without `EMIT` the message ends at the separator after the value, which
            // becomes its LF; whitespace there has already stopped the scan.
            let end = if EMIT {
                self.out.push(b'\n');
                self.out.len()
            } else {
                self.i + 1
            };
            let len = u32::try_from(end - self.msg_start).map_err(|_| JsonError::Invalid)?;
            self.lens.push(len);
            self.msg_start = end;
        }
        Ok(if depth == 0 {
            Expect::Done
        } else {
            Expect::CommaOrEnd
        })
    }

    /// Copies a string token verbatim after checking escapes, control characters and UTF-8.
    fn string(&mut self) -> Result<(), JsonError> {
        let b = self.b;
        let start = self.i;
        let mut i = self.i + 1;
        let mut non_ascii = false;
        loop {
            let (at, high) = skip_plain(b, i);
            i = at;
            non_ascii |= high;
            // Plain run: everything but quote, backslash and control characters.
            while i < b.len() && b[i] != b'"' && b[i] != b'\\' && b[i] >= 0x20 {
                non_ascii |= b[i] >= 0x80;
                i += 1;
            }
            match b.get(i) {
                Some(b'"') => {
                    i += 1;
                    break;
                }
                Some(b'\\') => match b.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                    Some(b'u') => i = unicode_escape(b, i)?,
                    _ => return Err(JsonError::Invalid),
                },
                // Raw control character or unterminated string.
                _ => return Err(JsonError::Invalid),
            }
        }
        if non_ascii && simdutf8::basic::from_utf8(&b[start..i]).is_err() {
            return Err(JsonError::Invalid);
        }
        self.emit_slice(start, i);
        self.i = i;
        Ok(())
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, copied as the exact lexeme.
    fn number(&mut self) -> Result<(), JsonError> {
        let b = self.b;
        let start = self.i;
        let mut i = self.i;
        let digits = |i: &mut usize| -> usize {
            let s = *i;
            while *i < b.len() && b[*i].is_ascii_digit() {
                *i += 1;
            }
            *i - s
        };
        if b[i] == b'-' {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                digits(&mut i);
            }
            _ => return Err(JsonError::Invalid),
        }
        if b.get(i) == Some(&b'.') {
            i += 1;
            if digits(&mut i) == 0 {
                return Err(JsonError::Invalid);
            }
        }
        if matches!(b.get(i), Some(b'e' | b'E')) {
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if digits(&mut i) == 0 {
                return Err(JsonError::Invalid);
            }
        }
        self.emit_slice(start, i);
        self.i = i;
        Ok(())
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), JsonError> {
        if !self.b[self.i..].starts_with(word) {
            return Err(JsonError::Invalid);
        }
        self.emit_slice(self.i, self.i + word.len());
        self.i += word.len();
        Ok(())
    }
}

/// Renders canonical NDJSON as a JSON array (`[m1,m2]`, `[]` when empty).
///
/// The slices together must hold whole lines, but a line may span slices (storage
/// hands out whatever segments it has).
pub fn render_array(ndjson: &[&[u8]]) -> Vec<u8> {
    let total: usize = ndjson.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(total + 2);
    out.push(b'[');
    for part in ndjson {
        let mut last = 0;
        for lf in memchr_iter(b'\n', part) {
            out.extend_from_slice(&part[last..lf]);
            out.push(b',');
            last = lf + 1;
        }
        out.extend_from_slice(&part[last..]);
    }
    if out.last() == Some(&b',') {
        out.pop();
    }
    out.push(b']');
    out
}

/// The `\uXXXX` escape at `b[i]` (the backslash), and the index after it. A high surrogate
/// must be followed by an escaped low surrogate and the pair is taken whole; a lone
/// surrogate is refused: it is no Unicode scalar value, so no UTF-8 reader could take the
/// string back.
fn unicode_escape(b: &[u8], i: usize) -> Result<usize, JsonError> {
    let unit = |at: usize| -> Result<u16, JsonError> {
        let hex = b.get(at..at + 4).ok_or(JsonError::Invalid)?;
        hex.iter()
            .try_fold(0u16, |v, &c| {
                let digit = char::from(c).to_digit(16)?;
                Some(v << 4 | digit as u16)
            })
            .ok_or(JsonError::Invalid)
    };
    match unit(i + 2)? {
        0xD800..=0xDBFF => {
            if b.get(i + 6..i + 8) != Some(b"\\u") {
                return Err(JsonError::Invalid);
            }
            match unit(i + 8)? {
                0xDC00..=0xDFFF => Ok(i + 12),
                _ => Err(JsonError::Invalid),
            }
        }
        0xDC00..=0xDFFF => Err(JsonError::Invalid),
        _ => Ok(i + 6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(body: &str) -> Vec<String> {
        let c = canonicalize(body.as_bytes(), true).expect("valid");
        assert_eq!(
            c.message_lens.iter().map(|&l| l as usize).sum::<usize>(),
            c.bytes.len()
        );
        c.messages()
            .map(|m| {
                assert_eq!(m.last(), Some(&b'\n'));
                assert!(!m[..m.len() - 1].contains(&b'\n'));
                String::from_utf8(m.to_vec()).expect("utf8")
            })
            .collect()
    }

    #[test]
    fn single_values() {
        assert_eq!(msgs(r#"{"e":1}"#), ["{\"e\":1}\n"]);
        assert_eq!(msgs(r#""s""#), ["\"s\"\n"]);
        assert_eq!(msgs("42"), ["42\n"]);
        assert_eq!(msgs("true"), ["true\n"]);
        assert_eq!(msgs("null"), ["null\n"]);
        assert_eq!(
            msgs("  \n\t{ \"a\" : [ 1 , 2 ] }\r\n "),
            ["{\"a\":[1,2]}\n"]
        );
    }

    #[test]
    fn flattening_one_level() {
        assert_eq!(msgs(r#"[{"a":1},{"b":2}]"#), ["{\"a\":1}\n", "{\"b\":2}\n"]);
        assert_eq!(msgs("[[1,2],[3,4]]"), ["[1,2]\n", "[3,4]\n"]);
        assert_eq!(msgs("[[[1,2,3]]]"), ["[[1,2,3]]\n"]);
        assert_eq!(msgs("[ 1 , \"x\" , null ]"), ["1\n", "\"x\"\n", "null\n"]);
        assert_eq!(msgs("[{}]"), ["{}\n"]);
        assert_eq!(msgs("[[]]"), ["[]\n"]);
        assert_eq!(msgs("[\"a,b\",\"]\"]"), ["\"a,b\"\n", "\"]\"\n"]);
    }

    fn lines(body: &str) -> Result<Vec<String>, LinesError> {
        let c = canonicalize_lines(body.as_bytes())?;
        assert_eq!(
            c.message_lens.iter().map(|&l| l as usize).sum::<usize>(),
            c.bytes.len()
        );
        Ok(c.messages()
            .map(|m| String::from_utf8(m.to_vec()).expect("utf8"))
            .collect())
    }

    #[test]
    fn ndjson_lines_are_one_message_each() {
        assert_eq!(
            lines("{\"a\": 1}\n[1, 2]\n\"s\"\n"),
            Ok(vec![
                "{\"a\":1}\n".to_string(),
                "[1,2]\n".to_string(),
                "\"s\"\n".to_string()
            ])
        );
        // No LF after the last line, CRLF line ends, empty and blank lines skipped.
        assert_eq!(
            lines("\n1\r\n\n  \t\r\n 2 \n\n[]"),
            Ok(vec![
                "1\n".to_string(),
                "2\n".to_string(),
                "[]\n".to_string()
            ])
        );
        // Each line is canonical on its own: the same bytes as a one-value body.
        let line = "{ \"k\" : [ {\"x\" : \"\\u00e9\" } ] , \"n\" : -1.5e3 }";
        assert_eq!(
            lines(line).map(|l| l.concat().into_bytes()),
            Ok(canonicalize(line.as_bytes(), false).expect("valid").bytes)
        );
    }

    #[test]
    fn ndjson_names_the_first_bad_line() {
        assert_eq!(
            lines("1\n{\"a\":\n2\n"),
            Err(LinesError::Invalid { line: 2 })
        );
        // Empty lines count: the number is the line an editor shows.
        assert_eq!(lines("\n\n1 2\n"), Err(LinesError::Invalid { line: 3 }));
        // A value spread over lines is not NDJSON.
        assert_eq!(lines("{\n\"a\":1}"), Err(LinesError::Invalid { line: 1 }));
        assert_eq!(
            lines("1\n\"tab\tinside\"\n"),
            Err(LinesError::Invalid { line: 2 })
        );
        assert_eq!(
            lines("1\n\u{feff}2\n"),
            Err(LinesError::Invalid { line: 2 })
        );
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(
            lines(&format!("1\n{deep}")),
            Err(LinesError::Invalid { line: 2 })
        );
        assert_eq!(lines(""), Err(LinesError::Empty));
        assert_eq!(lines("\n \r\n\n"), Err(LinesError::Empty));
        assert_eq!(
            LinesError::Invalid { line: 7 }.to_string(),
            "line 7 is not a JSON value"
        );
    }

    #[test]
    fn spec_byte_count() {
        let c = canonicalize(br#"[{"id":0},{"id":1},{"id":2}]"#, false).expect("valid");
        assert_eq!(c.bytes.len(), 27);
        assert_eq!(c.message_lens, [9, 9, 9]);
        assert_eq!(c.bytes, b"{\"id\":0}\n{\"id\":1}\n{\"id\":2}\n");
    }

    #[test]
    fn whitespace_and_escapes_in_strings_kept() {
        assert_eq!(
            msgs(r#"{ "k y" : "  a  b\t" }"#),
            ["{\"k y\":\"  a  b\\t\"}\n"]
        );
        assert_eq!(
            msgs(r#"["line\nbreak", "q\"uote", "back\\slash\\", "\u00e9\ud83d\ude00"]"#),
            [
                "\"line\\nbreak\"\n",
                "\"q\\\"uote\"\n",
                "\"back\\\\slash\\\\\"\n",
                "\"\\u00e9\\ud83d\\ude00\"\n"
            ]
        );
        assert_eq!(msgs("\"héllo 😀\""), ["\"héllo 😀\"\n"]);
    }

    #[test]
    fn number_lexemes_kept() {
        assert_eq!(
            msgs("[12345678901234567890123, 1.50, -0.0, 1E+10, 2e-3]"),
            [
                "12345678901234567890123\n",
                "1.50\n",
                "-0.0\n",
                "1E+10\n",
                "2e-3\n"
            ]
        );
        assert_eq!(
            msgs("{\"n\": 1.000000000000000000001}"),
            ["{\"n\":1.000000000000000000001}\n"]
        );
    }

    #[test]
    fn grammatical_but_unrepresentable_numbers_kept() {
        // JSON.parse accepts these; canonical storage is lexical, so nothing is lost.
        assert_eq!(msgs("[38E869]"), ["38E869\n"]);
    }

    #[test]
    fn lone_surrogates_refused_pairs_kept() {
        for bad in [
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800x\"",
            "\"\\ud800\\n\"",
            "\"\\ud800\\u0041\"",
            "\"\\ud800\\ud800\"",
            "\"\\udfff\\ud800\"",
            "[\"ok\", \"\\uDBFF\"]",
        ] {
            assert_eq!(
                canonicalize(bad.as_bytes(), false).err(),
                Some(JsonError::Invalid),
                "{bad}"
            );
        }
        assert_eq!(
            msgs("[\"\\ud83d\\ude00\", \"\\uDBFF\\uDFFF\"]"),
            ["\"\\ud83d\\ude00\"\n", "\"\\uDBFF\\uDFFF\"\n"]
        );
    }

    #[test]
    fn empty_array() {
        assert_eq!(canonicalize(b"[]", false), Err(JsonError::EmptyArray));
        assert_eq!(canonicalize(b" [ \n ] ", false), Err(JsonError::EmptyArray));
        let c = canonicalize(b"[]", true).expect("allowed on PUT");
        assert!(c.bytes.is_empty());
        assert_eq!(c.message_count(), 0);
        // A nested empty array is an ordinary message.
        assert_eq!(msgs("[[]]").len(), 1);
    }

    #[test]
    fn invalid_inputs() {
        for bad in [
            "",
            "   ",
            "{",
            "}",
            "[",
            "]",
            "[1,]",
            "[,1]",
            "[1,,2]",
            "[1 2]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":}",
            "{1:2}",
            "[1]]",
            "[1]x",
            "{} {}",
            "1 2",
            "\"a\" \"b\"",
            "[}",
            "{]",
            "\"unterminated",
            "\"bad \\x escape\"",
            "\"raw\nnewline\"",
            "\"raw\ttab\"",
            "tru",
            "True",
            "nul",
            "NaN",
            "Infinity",
            "01",
            "1.",
            ".5",
            "+1",
            "-",
            "1e",
            "0x10",
            "'single'",
            "{\"a\":1}\u{0}",
            "\u{feff}{}",
            "[1]\n[2]",
            "// comment\n1",
        ] {
            assert_eq!(
                canonicalize(bad.as_bytes(), true),
                Err(JsonError::Invalid),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn special_bytes_are_found_at_every_position_of_a_long_string() {
        // The string scan skips 64-byte blocks, then 8-byte words; put each special byte at
        // every offset of a 200-byte run so it lands in every lane of a block and of a
        // word, and in the unaligned tail.
        const RUN: usize = 200;
        for at in 0..RUN {
            let mut s = vec![b'a'; RUN];
            s[at] = b'"';
            let body = [b"[\"".as_slice(), &s, b"\"]"].concat();
            // The early quote closes the string; what follows is garbage unless it is the end.
            assert_eq!(canonicalize(&body, true), Err(JsonError::Invalid), "{at}");

            s[at] = b'\\';
            if at < RUN - 1 {
                s[at + 1] = b'n';
            }
            let body = [b"\"".as_slice(), &s, b"\""].concat();
            // At the last position the backslash escapes the closing quote.
            assert_eq!(
                canonicalize(&body, true).is_ok(),
                at < RUN - 1,
                "escape at {at}"
            );

            let mut s = vec![b'a'; RUN];
            s[at] = 0x1f;
            let body = [b"\"".as_slice(), &s, b"\""].concat();
            assert_eq!(canonicalize(&body, true), Err(JsonError::Invalid), "{at}");

            // DEL and UTF-8 bytes (0x80 and up) are plain string content.
            let mut s = vec![b'a'; RUN];
            s[at] = 0x7f;
            let body = [b"\"\xc3\xa9".as_slice(), &s, "é\"".as_bytes()].concat();
            let canonical = canonicalize(&body, true).map(|c| c.bytes);
            assert_eq!(canonical, Ok([body.as_slice(), b"\n"].concat()), "{at}");

            // A lone non-ASCII byte anywhere in an otherwise ASCII string must reach the
            // UTF-8 check, whichever loop skipped it.
            let mut s = vec![b'a'; RUN];
            s[at] = 0xff;
            let body = [b"\"".as_slice(), &s, b"\""].concat();
            assert_eq!(
                canonicalize(&body, true),
                Err(JsonError::Invalid),
                "0xff at {at}"
            );
        }
    }

    #[test]
    fn invalid_utf8_rejected() {
        assert_eq!(canonicalize(b"\"\xff\"", true), Err(JsonError::Invalid));
        assert_eq!(
            canonicalize(b"[\"ok\", \"\xc3\"]", true),
            Err(JsonError::Invalid)
        );
        assert_eq!(
            canonicalize(b"\xef\xbb\xbf{}", true),
            Err(JsonError::Invalid)
        );
        // Long strings are checked word by word: bad bytes deep inside, an overlong
        // encoding, a surrogate, a sequence cut by the closing quote.
        for bad in [
            b"\"aaaaaaaaaaaaaaaa\xffaaaaaaaaaaaaaaa\"".as_slice(),
            b"{\"kkkkkkkkkkkkkkkkkk\xc0\x80\":1}",
            b"\"aaaaaaaaaaaaaaaa\xed\xa0\x80aaaaaaaa\"",
            b"\"aaaaaaaaaaaaaaaaaaaaaaa\xc3\"",
        ] {
            assert_eq!(canonicalize(bad, true), Err(JsonError::Invalid), "{bad:?}");
        }
        // Non-ASCII outside strings is a grammar error.
        assert_eq!(
            canonicalize("[1,é]".as_bytes(), true),
            Err(JsonError::Invalid)
        );
        assert_eq!(
            canonicalize("{é:1}".as_bytes(), true),
            Err(JsonError::Invalid)
        );
        let ok = "[\"ключ значение ключ значение\", {\"é\":\"ü\"}]";
        assert!(canonicalize(ok.as_bytes(), true).is_ok());
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(canonicalize(ok.as_bytes(), true).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(canonicalize(deep.as_bytes(), true), Err(JsonError::Invalid));
        // Unbalanced and absurdly deep: must fail fast without exhausting the stack.
        let huge = "[".repeat(1_000_000);
        assert_eq!(canonicalize(huge.as_bytes(), true), Err(JsonError::Invalid));
        let objs = "{\"a\":".repeat(100_000);
        assert_eq!(canonicalize(objs.as_bytes(), true), Err(JsonError::Invalid));
    }

    #[test]
    fn max_depth_needs_no_stack() {
        // The scanner is iterative: the worst accepted nesting runs on a tiny stack.
        let h = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(|| {
                let mut s = String::new();
                for _ in 0..MAX_DEPTH / 2 {
                    s.push_str("{\"k\":[");
                }
                s.push('1');
                for _ in 0..MAX_DEPTH / 2 {
                    s.push_str("]}");
                }
                canonicalize(s.as_bytes(), false).map(|c| c.message_count())
            })
            .expect("spawn");
        assert_eq!(h.join().ok(), Some(Ok(1)));
    }

    /// Grammar-level oracle. sonic-rs's skip path checks neither the hex digits of `\\u`
    /// escapes (RFC 8259 requires four) nor that surrogates come in pairs, where we are
    /// stricter; its DOM path is no better oracle since it also rejects out-of-range
    /// numbers, which we keep byte-for-byte like `JSON.parse` does.
    fn sonic_accepts(b: &[u8]) -> bool {
        sonic_rs::from_slice::<serde::de::IgnoredAny>(b).is_ok() && !has_bad_u_escape(b)
    }

    fn has_bad_u_escape(b: &[u8]) -> bool {
        // Each `\u` escape needs four hex digits, and a high surrogate must be followed at
        // once by an escaped low one (and a low one preceded by a high one).
        let mut i = 0;
        let mut high_pending = false;
        while i < b.len() {
            if b[i] == b'\\' && b.get(i + 1) == Some(&b'u') {
                let unit = b.get(i + 2..i + 6).and_then(|h| {
                    h.iter()
                        .try_fold(0u32, |v, &c| Some(v << 4 | char::from(c).to_digit(16)?))
                });
                let Some(unit) = unit else {
                    return true;
                };
                let low = (0xDC00..0xE000).contains(&unit);
                if high_pending != low {
                    return true;
                }
                high_pending = (0xD800..0xDC00).contains(&unit);
                i += 6;
            } else if high_pending {
                return true;
            } else {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
        }
        high_pending
    }

    #[test]
    fn agrees_with_sonic_on_corpus() {
        for case in [
            "0",
            "-0",
            "1.5e-3",
            "[1,2]",
            "{\"a\":{\"b\":[null,true,false]}}",
            "\"\\u00ZZ\"",
            "\"\\ud800\"",
            "\"\\/\"",
            "[1,]",
            "{\"a\"}",
            "01",
            "-01",
            "1e+",
            "[\"\\\"]",
            "  [ ]  ",
            "{} ",
            "\"\u{7f}\"",
            "[-]",
            "[0.]",
            "[.0]",
            "[1e5]",
            "[1E-0]",
            "nulll",
            "[true false]",
            "{\"a\":1 \"b\":2}",
            "{,}",
            "[,]",
            ":",
            "\"a\":1",
        ] {
            assert_eq!(
                canonicalize(case.as_bytes(), true).is_ok(),
                sonic_accepts(case.as_bytes()),
                "{case:?}"
            );
        }
    }

    /// A small deterministic generator (xorshift64) for the random-input tests.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn agrees_with_sonic_on_random_inputs() {
        const ALPHABET: &[u8] = b"[]{}\",:0123456789-+.eE tfrualsn\\/u\n\tAx";
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
        let mut buf = Vec::new();
        let mut valid = 0;
        for _ in 0..300_000 {
            buf.clear();
            let len = 1 + (next() % 14) as usize;
            for _ in 0..len {
                buf.push(ALPHABET[(next() % ALPHABET.len() as u64) as usize]);
            }
            let ours = canonicalize(&buf, true).is_ok();
            assert_eq!(
                ours,
                sonic_accepts(&buf),
                "{:?}",
                String::from_utf8_lossy(&buf)
            );
            valid += usize::from(ours);
        }
        assert!(
            valid > 100,
            "the generator should hit valid JSON sometimes ({valid})"
        );
    }

    /// `canonicalize_in_place` on a copy of `body`: the canonical bytes when it rewrote the
    /// body, checked against `canonicalize`.
    fn in_place(body: &[u8], allow_empty: bool) -> Result<Option<Vec<u8>>, JsonError> {
        let mut b = body.to_vec();
        let got = canonicalize_in_place(&mut b, allow_empty)?;
        let Some(got) = got else {
            assert_eq!(b, body, "a declined body is left as it was");
            return Ok(None);
        };
        let want = canonicalize(body, allow_empty).expect("in place accepted it");
        assert_eq!(&b[got.range.clone()], want.bytes.as_slice());
        assert_eq!(got.message_lens, want.message_lens);
        Ok(Some(b[got.range].to_vec()))
    }

    #[test]
    fn in_place_rewrites_compact_arrays() {
        let ok = |body: &str, want: &str| {
            assert_eq!(
                in_place(body.as_bytes(), true),
                Ok(Some(want.as_bytes().to_vec())),
                "{body}"
            );
        };
        ok(
            r#"[1,"a",{"b":[2,3]},null]"#,
            "1\n\"a\"\n{\"b\":[2,3]}\nnull\n",
        );
        ok(
            " \r\n[{\"s\":\"x y, z]\"},[]] \n",
            "{\"s\":\"x y, z]\"}\n[]\n",
        );
        ok("[\"\\\",\"]", "\"\\\",\"\n");
        ok("[]", "");
        ok("[[[1]]]", "[[1]]\n");
    }

    #[test]
    fn in_place_declines_what_needs_copying() {
        for body in [
            "{\"a\":1}",
            "1",
            "\"x\"",
            "[1, 2]",
            "[ 1]",
            "[1 ]",
            "[{\"a\" :1}]",
            "[{\"a\":[1,\n2]}]",
        ] {
            assert_eq!(in_place(body.as_bytes(), true), Ok(None), "{body:?}");
            assert!(canonicalize(body.as_bytes(), true).is_ok(), "{body:?}");
        }
    }

    #[test]
    fn in_place_errors_are_canonicalize_errors() {
        assert_eq!(in_place(b"[]", false), Err(JsonError::EmptyArray));
        for body in [
            &b"["[..],
            b"[1,]",
            b"[1]]",
            b"[1]x",
            b"[01]",
            b"[\"\x01\"]",
            b"[\"\xff\"]",
            b"[1,2",
            b"[{\"a\"}]",
        ] {
            assert_eq!(in_place(body, true), Err(JsonError::Invalid), "{body:?}");
            assert_eq!(
                canonicalize(body, true),
                Err(JsonError::Invalid),
                "{body:?}"
            );
        }
    }

    #[test]
    fn in_place_agrees_with_canonicalize_on_random_inputs() {
        const ALPHABET: &[u8] = b"[]{}\",:0123456789-.e tfrualsn\\x";
        let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
        let mut buf = Vec::new();
        let mut rewritten = 0;
        for _ in 0..300_000 {
            buf.clear();
            buf.push(b'[');
            for _ in 0..(next() % 14) {
                buf.push(ALPHABET[(next() % ALPHABET.len() as u64) as usize]);
            }
            buf.push(b']');
            // `in_place` checks a rewrite against `canonicalize`; here the verdicts.
            let allow_empty = next() % 2 == 0;
            match in_place(&buf, allow_empty) {
                Ok(Some(_)) => rewritten += 1,
                Ok(None) => {}
                Err(e) => assert_eq!(
                    canonicalize(&buf, allow_empty).err(),
                    Some(e),
                    "{:?}",
                    String::from_utf8_lossy(&buf)
                ),
            }
        }
        assert!(
            rewritten > 1000,
            "the generator should hit valid arrays ({rewritten})"
        );
    }

    #[test]
    fn minified_equals_input_without_whitespace_on_random_valid() {
        // For valid non-array texts without strings, canonical = input minus ws.
        for case in ["{ \"a\" : [ 1 , 2.50 , { } ] , \"b\" : null }", " -1.0E+2 "] {
            let c = canonicalize(case.as_bytes(), false).expect("valid");
            let mut want: Vec<u8> = case.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
            want.push(b'\n');
            // Keys contain no whitespace here, so the filter is exact.
            assert_eq!(c.bytes, want);
        }
    }

    #[test]
    fn canonical_output_is_itself_canonical() {
        for body in [
            r#"[{"a": [1, 2, {"b": "c d"}]}, 3, "x"]"#,
            r#"{"nested": [[1], [2]], "s": "\"]\\"}"#,
        ] {
            let c = canonicalize(body.as_bytes(), true).expect("valid");
            for m in c.messages() {
                let again = canonicalize(m, true).expect("message re-validates");
                if m.first() == Some(&b'[') {
                    continue; // would flatten again
                }
                assert_eq!(again.bytes, m);
            }
        }
    }

    #[test]
    fn render_array_joins_lines() {
        assert_eq!(render_array(&[]), b"[]");
        assert_eq!(render_array(&[b""]), b"[]");
        assert_eq!(render_array(&[b"1\n"]), b"[1]");
        assert_eq!(
            render_array(&[
                b"{\"event\":\"first\"}\n{\"event\":\"second\"}\n",
                b"{\"event\":\"third\"}\n"
            ]),
            br#"[{"event":"first"},{"event":"second"},{"event":"third"}]"#.to_vec()
        );
        // A line spanning two slices.
        assert_eq!(render_array(&[b"{\"a\":", b"1}\n2\n"]), b"[{\"a\":1},2]");
    }

    #[test]
    fn render_round_trips_canonical() {
        let c = canonicalize(br#"[{"id":0},{"id":1},{"id":2}]"#, false).expect("valid");
        let arr = render_array(&[&c.bytes]);
        assert_eq!(arr, br#"[{"id":0},{"id":1},{"id":2}]"#.to_vec());
        let again = canonicalize(&arr, false).expect("valid");
        assert_eq!(again, c);
    }
}
