//! RFC 3339 timestamps to and from milliseconds since the epoch (UTC), without a calendar
//! dependency.

/// Milliseconds in one UTC day: the width of a part's partition.
pub const DAY_MS: i64 = 86_400_000;

/// Parse `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`; digits below the millisecond are
/// truncated. `t`/`z` in lower case and a space separator are accepted (RFC 3339 §5.6 note).
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if !part.iter().all(|c| c.is_ascii_digit()) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    let year = num(0..4)?;
    let month = num(5..7)?;
    let day = num(8..10)?;
    let hour = num(11..13)?;
    let min = num(14..16)?;
    let sec = num(17..19)?;
    if b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || min > 59
        || sec > 60
    {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 3 {
                ms += i64::from(b[i] - b'0') * 10i64.pow(2 - (i - start) as u32);
            }
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            if oh > 23 || om > 59 {
                return None;
            }
            let v = oh * 60 + om;
            if *sign == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec.min(59) - offset_min * 60;
    Some(secs * 1000 + ms)
}

/// `from`/`until` query values: signed integer milliseconds, or RFC 3339.
pub fn parse_query_time(s: &str) -> Option<i64> {
    let digits = s.strip_prefix('-').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()) {
        return s.parse().ok();
    }
    parse_rfc3339_ms(s)
}

/// The start of the UTC day containing `t_ms`.
pub fn day_start(t_ms: i64) -> i64 {
    t_ms.div_euclid(DAY_MS) * DAY_MS
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-07-18T10:30:00.100Z"),
            Some(1784370600100)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-07-18T12:30:00.1009+02:00"),
            Some(1784370600100)
        );
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59.999Z"), Some(-1));
        assert_eq!(parse_rfc3339_ms("2026-02-30T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_ms("2026-07-18T10:30:00"), None);
        assert_eq!(parse_rfc3339_ms("2026-07-18T10:30:00.Z"), None);
        assert_eq!(parse_query_time("-5"), Some(-5));
        assert_eq!(day_start(-1), -DAY_MS);
    }
}
