//! Offsets (P§3): 20-digit zero-padded decimal byte positions.

/// Width of every emitted offset; `u64::MAX` has exactly 20 decimal digits, so
/// string order equals numeric order for all positions.
pub const OFFSET_LEN: usize = 20;

/// The 20-digit token for byte position `pos`.
pub fn format_offset(pos: u64) -> String {
    let mut buf = Vec::with_capacity(OFFSET_LEN);
    write_offset(&mut buf, pos);
    // Only ASCII digits were written.
    String::from_utf8(buf).unwrap_or_default()
}

/// Appends the 20-digit token for `pos` to `buf` (hot path: headers, SSE controls).
pub fn write_offset(buf: &mut Vec<u8>, pos: u64) {
    let mut digits = [b'0'; OFFSET_LEN];
    let mut n = pos;
    let mut i = OFFSET_LEN;
    while n > 0 {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
    }
    buf.extend_from_slice(&digits);
}

/// A parsed `offset` query parameter or path offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetParam {
    /// `-1`: the beginning of the stream.
    Start,
    /// `now`: the current tail.
    Now,
    /// An explicit byte position.
    At(u64),
}

/// Why an offset input was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetError {
    /// Not `-1`, `now` or 1–20 ASCII digits.
    Syntax,
    /// Digits whose value is past `u64::MAX` (only 20-digit inputs can be).
    OutOfRange,
}

impl OffsetError {
    /// A short reason for the client.
    pub fn reason(self) -> &'static str {
        match self {
            OffsetError::Syntax => "offset must be -1, now or 1-20 digits",
            OffsetError::OutOfRange => "offset is past the largest offset (18446744073709551615)",
        }
    }
}

/// Parses an offset input per P§3.2. Only `-1`, `now` and 1–20 ASCII digits whose
/// value fits `u64` are accepted; no trimming, signs or other spellings, because the
/// conformance suite fuzzes exactly those.
pub fn parse_offset(s: &str) -> Result<OffsetParam, OffsetError> {
    match s {
        "-1" => Ok(OffsetParam::Start),
        "now" => Ok(OffsetParam::Now),
        _ => parse_digits(s.as_bytes()).map(OffsetParam::At),
    }
}

/// Parses `Stream-Fork-Offset` (P§3.4): plain digits as in [`parse_offset`] or the
/// reference server's legacy `^[0-9]{16}_[0-9]{16}$` form whose second half is the
/// byte position. Sentinels (`-1`, `now`) are not fork points.
pub fn parse_fork_offset(s: &str) -> Result<u64, OffsetError> {
    let b = s.as_bytes();
    if b.len() == 33 && b[16] == b'_' {
        let (first, rest) = (&b[..16], &b[17..]);
        if !first.iter().all(u8::is_ascii_digit) {
            return Err(OffsetError::Syntax);
        }
        return parse_digits(rest);
    }
    parse_digits(b)
}

/// 1–20 ASCII digits that fit in a `u64` (leading zeros allowed).
pub fn parse_digits(b: &[u8]) -> Result<u64, OffsetError> {
    if b.is_empty() || b.len() > OFFSET_LEN || !b.iter().all(u8::is_ascii_digit) {
        return Err(OffsetError::Syntax);
    }
    b.iter()
        .try_fold(0u64, |v, &c| {
            v.checked_mul(10)?.checked_add(u64::from(c - b'0'))
        })
        .ok_or(OffsetError::OutOfRange)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_is_zero_padded_20_digits() {
        assert_eq!(format_offset(0), "00000000000000000000");
        assert_eq!(format_offset(42), "00000000000000000042");
        assert_eq!(format_offset(u64::MAX), "18446744073709551615");
        assert_eq!(format_offset(u64::MAX).len(), OFFSET_LEN);
    }

    #[test]
    fn write_appends() {
        let mut buf = b"x=".to_vec();
        write_offset(&mut buf, 1234567890);
        assert_eq!(buf, b"x=00000000001234567890");
    }

    #[test]
    fn string_order_is_numeric_order() {
        let vals = [0u64, 9, 10, 99, 100, 12345, u64::MAX / 3, u64::MAX];
        for w in vals.windows(2) {
            assert!(format_offset(w[0]) < format_offset(w[1]));
        }
    }

    #[test]
    fn parse_sentinels_and_digits() {
        assert_eq!(parse_offset("-1"), Ok(OffsetParam::Start));
        assert_eq!(parse_offset("now"), Ok(OffsetParam::Now));
        assert_eq!(parse_offset("0"), Ok(OffsetParam::At(0)));
        assert_eq!(parse_offset("42"), Ok(OffsetParam::At(42)));
        assert_eq!(
            parse_offset("00000000000000000042"),
            Ok(OffsetParam::At(42))
        );
        assert_eq!(
            parse_offset("18446744073709551615"),
            Ok(OffsetParam::At(u64::MAX))
        );
    }

    #[test]
    fn parse_round_trips_format() {
        for v in [0, 1, 7, 1 << 40, u64::MAX] {
            assert_eq!(parse_offset(&format_offset(v)), Ok(OffsetParam::At(v)));
        }
    }

    #[test]
    fn parse_rejects_garbage() {
        for bad in [
            "",
            " ",
            " 1",
            "1 ",
            "../",
            "/..",
            "..",
            "1/2",
            "/",
            ",",
            "1,2",
            "1\0",
            "\0",
            "1\n",
            "1\r\n",
            "abc",
            "NOW",
            "Now",
            "-2",
            "-0",
            "+1",
            "-1 ",
            "1.5",
            "1e3",
            "0x10",
            "000000000000000000000", // 21 digits
            "\u{0661}",              // Arabic-Indic digit one
        ] {
            assert_eq!(parse_offset(bad), Err(OffsetError::Syntax), "{bad:?}");
        }
    }

    #[test]
    fn twenty_digits_past_u64_are_out_of_range_not_malformed() {
        for big in ["18446744073709551616", "99999999999999999999"] {
            assert_eq!(parse_offset(big), Err(OffsetError::OutOfRange), "{big:?}");
        }
        assert!(OffsetError::OutOfRange.reason().contains("largest offset"));
    }

    #[test]
    fn fork_offset_forms() {
        assert_eq!(parse_fork_offset("5"), Ok(5));
        assert_eq!(parse_fork_offset("00000000000000000005"), Ok(5));
        assert_eq!(
            parse_fork_offset("0000000000000000_0000000000000000"),
            Ok(0)
        );
        assert_eq!(
            parse_fork_offset("9999999999999999_9999999999999999"),
            Ok(9_999_999_999_999_999)
        );
        assert_eq!(
            parse_fork_offset("0000000000000003_0000000000000017"),
            Ok(17)
        );
    }

    #[test]
    fn fork_offset_rejects() {
        for bad in [
            "",
            "-1",
            "now",
            "abc",
            " 5",
            "000000000000000_0000000000000000",   // 15_16
            "0000000000000000_000000000000000",   // 16_15
            "0000000000000000_00000000000000000", // 16_17
            "000000000000000a_0000000000000000",
            "0000000000000000_000000000000000a",
            "0000000000000000-0000000000000000",
            "_",
            "18446744073709551616",
        ] {
            assert!(parse_fork_offset(bad).is_err(), "{bad:?}");
        }
    }
}
