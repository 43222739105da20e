//! The 64-bit layout and its arithmetic, in plain Rust (no pgrx types).
//!
//! ```text
//!  63 ........... 23 | 22 ..... 10 | 9 ..... 0
//!  41-bit ms since   | 13-bit      | 10-bit
//!  the epoch         | shard       | sequence
//! ```
//!
//! The time field is 41 bits wide, but `bigint` is signed: its top bit is
//! the sign, and an ID with it set would be negative and sort before every
//! other. So the time field's top bit stays 0 and IDs carry 2^40 ms (34.8
//! years) from the epoch: with the default epoch, until 2060-11-03.
//!
//! Times cross this module as PostgreSQL `timestamptz` values (microseconds
//! since 2000-01-01 UTC) and the epoch as milliseconds since 1970-01-01 UTC.

use super::error::CoreError;
use super::generator::TickFormat;

pub const SHARD_BITS: u32 = 13;
pub const SEQ_BITS: u32 = 10;

pub const MAX_SHARD: i32 = (1 << SHARD_BITS) - 1;
pub const MAX_SEQ: i32 = (1 << SEQ_BITS) - 1;
/// The last millisecond an ID can carry: the 41-bit field with its top bit
/// (the sign bit of the `bigint`) clear.
pub const MAX_MS: i64 = i64::MAX >> (SHARD_BITS + SEQ_BITS);

/// Generator ticks of the 64-bit IDs: epoch milliseconds and the 10-bit sequence.
pub const ID_TICKS: TickFormat = TickFormat { bits: SEQ_BITS, max_ms: MAX_MS };

/// Microseconds from 1970-01-01 to 2000-01-01 (PostgreSQL's own epoch).
const PG_EPOCH_UNIX_US: i64 = 946_684_800_000_000;

/// A logical shard number, known to be in 0..=8191.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard(u16);

impl Shard {
    pub fn new(shard: i32) -> Result<Shard, CoreError> {
        if (0..=MAX_SHARD).contains(&shard) {
            Ok(Shard(shard as u16))
        } else {
            Err(CoreError::ShardOutOfRange(shard))
        }
    }

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The three fields of an ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    /// Milliseconds since the epoch, 0..=MAX_MS.
    pub ms: i64,
    pub shard: i32,
    pub seq: i32,
}

/// Builds an ID from a generator tick (`ms << 10 | seq`) and a shard.
#[inline]
pub fn from_tick(tick: u64, shard: Shard) -> i64 {
    let ms = tick >> SEQ_BITS;
    let seq = tick & MAX_SEQ as u64;
    ((ms << (SHARD_BITS + SEQ_BITS)) | ((shard.0 as u64) << SEQ_BITS) | seq) as i64
}

impl Parts {
    /// The generator tick (`ms << 10 | seq`) of these parts: the inverse of [`from_tick`].
    #[inline]
    pub fn tick(&self) -> u64 {
        ((self.ms as u64) << SEQ_BITS) | self.seq as u64
    }
}

pub fn compose(parts: Parts) -> Result<i64, CoreError> {
    if !(0..=MAX_MS).contains(&parts.ms) {
        return Err(CoreError::TimeOutOfRange);
    }
    let shard = Shard::new(parts.shard)?;
    if !(0..=MAX_SEQ).contains(&parts.seq) {
        return Err(CoreError::SeqOutOfRange(parts.seq));
    }
    Ok(from_tick(parts.tick(), shard))
}

pub fn decompose(id: i64) -> Result<Parts, CoreError> {
    if id < 0 {
        return Err(CoreError::NegativeId(id));
    }
    Ok(Parts {
        ms: id >> (SHARD_BITS + SEQ_BITS),
        shard: ((id >> SEQ_BITS) & MAX_SHARD as i64) as i32,
        seq: (id & MAX_SEQ as i64) as i32,
    })
}

/// The smallest ID that can carry millisecond `ms`.
pub fn lower_bound(ms: i64) -> Result<i64, CoreError> {
    compose(Parts { ms, shard: 0, seq: 0 })
}

/// How far apart two IDs are whose times lie an interval apart (`months`,
/// `days`, `micros`, as PostgreSQL keeps an interval): its milliseconds
/// shifted past the shard and sequence bits. Partitions of this width,
/// bounded at multiples of it, each hold the IDs of one such stretch of
/// time counted from the epoch (a day from each midnight UTC with an epoch
/// at midnight UTC). A day counts 24 hours; a month has no fixed length.
pub fn interval_span(months: i32, days: i32, micros: i64) -> Result<i64, CoreError> {
    if months != 0 {
        return Err(CoreError::BadInterval("a month has no fixed length: use days"));
    }
    // In 128 bits: days and microseconds each span more than 64 bits of microseconds together.
    let us = i128::from(days) * 86_400_000_000 + i128::from(micros);
    if us <= 0 {
        return Err(CoreError::BadInterval("it must be longer than zero"));
    }
    if us % 1000 != 0 {
        return Err(CoreError::BadInterval("IDs carry whole milliseconds"));
    }
    let ms = us / 1000;
    if ms > i128::from(MAX_MS) {
        return Err(CoreError::BadInterval("it is longer than the time IDs can carry"));
    }
    Ok((ms as i64) << (SHARD_BITS + SEQ_BITS))
}

/// The largest ID that can carry millisecond `ms`.
pub fn upper_bound(ms: i64) -> Result<i64, CoreError> {
    compose(Parts { ms, shard: MAX_SHARD, seq: MAX_SEQ })
}

/// The epoch-relative millisecond holding a `timestamptz` (rounded down).
/// Out of the range IDs carry (before the epoch, too late, or infinite) is an error.
pub fn ms_of_timestamptz(ts_us: i64, epoch_unix_ms: i64) -> Result<i64, CoreError> {
    if ts_us == i64::MIN || ts_us == i64::MAX {
        return Err(CoreError::TimeOutOfRange);
    }
    let unix_ms = ts_us.saturating_add(PG_EPOCH_UNIX_US).div_euclid(1000);
    let ms = unix_ms - epoch_unix_ms;
    if (0..=MAX_MS).contains(&ms) {
        Ok(ms)
    } else {
        Err(CoreError::TimeOutOfRange)
    }
}

/// Where a `timestamptz` falls against the range IDs carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Before,
    Within(i64),
    After,
}

/// The epoch-relative millisecond of a `timestamptz`, or which side of the range it lies on.
pub fn place_timestamptz(ts_us: i64, epoch_unix_ms: i64) -> Placed {
    match ms_of_timestamptz(ts_us, epoch_unix_ms) {
        Ok(ms) => Placed::Within(ms),
        Err(_) if ts_us < timestamptz_of_ms(0, epoch_unix_ms) => Placed::Before,
        Err(_) => Placed::After,
    }
}

/// The `timestamptz` (microseconds since 2000-01-01) of an epoch-relative millisecond.
pub fn timestamptz_of_ms(ms: i64, epoch_unix_ms: i64) -> i64 {
    (ms + epoch_unix_ms) * 1000 - PG_EPOCH_UNIX_US
}

/// Unix milliseconds of a `timestamptz` value (for callers that need Unix time).
pub fn unix_ms_of_timestamptz(ts_us: i64) -> i64 {
    ts_us.saturating_add(PG_EPOCH_UNIX_US).div_euclid(1000)
}

/// A Unix millisecond as `YYYY-MM-DD HH:MM:SS.mmm UTC` (proleptic
/// Gregorian, years 0 to 9999 and beyond), for messages.
pub fn format_unix_ms(ms: i64) -> String {
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date of a day count (H. Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, sec, milli) = (ms_of_day / 3_600_000, ms_of_day / 60_000 % 60, ms_of_day / 1000 % 60, ms_of_day % 1000);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{sec:02}.{milli:03} UTC")
}

/// Parses the epoch setting: `YYYY-MM-DD`, optionally followed by
/// ` HH:MM[:SS]` (or `T`), optionally followed by `Z`, `+00`, `+00:00` or
/// ` UTC`. Always UTC: an epoch that depended on a time zone would be a trap.
/// Returns Unix milliseconds.
pub fn parse_epoch(text: &str) -> Option<i64> {
    let t = text.trim();
    let t = t
        .strip_suffix(" UTC")
        .or_else(|| t.strip_suffix("+00:00"))
        .or_else(|| t.strip_suffix("+00"))
        .or_else(|| t.strip_suffix('Z'))
        .unwrap_or(t);
    let (date, time) = match t.find([' ', 'T']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let d: Vec<&str> = date.split('-').collect();
    if d.len() != 3 || d[0].len() != 4 || d[1].len() != 2 || d[2].len() != 2 {
        return None;
    }
    let num = |s: &str| -> Option<i64> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    };
    let (y, m, day) = (num(d[0])?, num(d[1])?, num(d[2])?);
    if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || day < 1 || day > days_in_month(y, m) {
        return None;
    }
    let mut secs = 0;
    if let Some(time) = time {
        let f: Vec<&str> = time.split(':').collect();
        if !(2..=3).contains(&f.len()) || f.iter().any(|p| p.len() != 2) {
            return None;
        }
        let (hh, mm) = (num(f[0])?, num(f[1])?);
        let ss = if f.len() == 3 { num(f[2])? } else { 0 };
        if hh > 23 || mm > 59 || ss > 59 {
            return None;
        }
        secs = hh * 3600 + mm * 60 + ss;
    }
    Some((days_from_civil(y, m, day) * 86_400 + secs) * 1000)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
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

    #[test]
    fn interval_spans_are_whole_milliseconds_shifted_past_shard_and_sequence() {
        let day = interval_span(0, 1, 0).unwrap();
        assert_eq!(day, 86_400_000 << 23);
        assert_eq!(interval_span(0, 0, 3_600_000_000), Ok(3_600_000 << 23));
        assert_eq!(interval_span(0, 1, -3_600_000_000), Ok(82_800_000 << 23));
        // Consecutive days' lower bounds are one span apart.
        assert_eq!(lower_bound(2 * 86_400_000).unwrap() - lower_bound(86_400_000).unwrap(), day);
        assert_eq!(interval_span(0, 0, MAX_MS * 1000), Ok(MAX_MS << 23));
        for (m, d, us) in [
            (1, 0, 0),
            (0, 0, 0),
            (0, -1, 0),
            (0, 0, 1500),
            (0, 0, (MAX_MS + 1) * 1000),
            (0, i32::MAX, i64::MAX),
            (0, i32::MIN, i64::MIN),
            (0, i32::MAX, 0),
        ] {
            assert!(matches!(interval_span(m, d, us), Err(CoreError::BadInterval(_))), "{m} {d} {us}");
        }
    }

    #[test]
    fn unix_ms_formats_as_utc() {
        assert_eq!(super::format_unix_ms(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(super::format_unix_ms((1 << 48) - 1), "10889-08-02 05:31:50.655 UTC");
        assert_eq!(super::format_unix_ms(1_288_834_974_657), "2010-11-04 01:42:54.657 UTC");
        assert_eq!(super::format_unix_ms(-1), "1969-12-31 23:59:59.999 UTC");
        assert_eq!(super::format_unix_ms(951_782_400_000), "2000-02-29 00:00:00.000 UTC");
    }

    use super::*;

    #[test]
    fn compose_and_decompose_round_trip_at_the_edges() {
        for &(ms, shard, seq) in &[(0, 0, 0), (MAX_MS, MAX_SHARD, MAX_SEQ), (1, 8191, 0), (123_456_789, 42, 513)] {
            let id = compose(Parts { ms, shard, seq }).unwrap();
            assert!(id >= 0);
            assert_eq!(decompose(id).unwrap(), Parts { ms, shard, seq });
        }
        assert_eq!(compose(Parts { ms: MAX_MS, shard: MAX_SHARD, seq: MAX_SEQ }).unwrap(), i64::MAX);
        assert_eq!(compose(Parts { ms: 1, shard: 0, seq: 0 }).unwrap(), 1 << 23);
        assert_eq!(MAX_MS, (1 << 40) - 1);
        assert_eq!(compose(Parts { ms: 0, shard: 1, seq: 0 }).unwrap(), 1 << 10);
    }

    #[test]
    fn out_of_range_parts_are_errors() {
        assert_eq!(compose(Parts { ms: 0, shard: 8192, seq: 0 }), Err(CoreError::ShardOutOfRange(8192)));
        assert_eq!(compose(Parts { ms: 0, shard: -1, seq: 0 }), Err(CoreError::ShardOutOfRange(-1)));
        assert_eq!(compose(Parts { ms: 0, shard: 0, seq: 1024 }), Err(CoreError::SeqOutOfRange(1024)));
        assert_eq!(compose(Parts { ms: -1, shard: 0, seq: 0 }), Err(CoreError::TimeOutOfRange));
        assert_eq!(compose(Parts { ms: MAX_MS + 1, shard: 0, seq: 0 }), Err(CoreError::TimeOutOfRange));
        assert_eq!(decompose(-5), Err(CoreError::NegativeId(-5)));
    }

    #[test]
    fn bounds_enclose_every_id_of_their_millisecond_and_no_other() {
        let ms = 1_000_000;
        let lo = lower_bound(ms).unwrap();
        let hi = upper_bound(ms).unwrap();
        assert_eq!(hi - lo + 1, 1 << 23);
        assert_eq!(upper_bound(ms - 1).unwrap() + 1, lo);
        assert_eq!(lower_bound(ms + 1).unwrap() - 1, hi);
        assert_eq!(decompose(lo).unwrap().ms, ms);
        assert_eq!(decompose(hi).unwrap().ms, ms);
    }

    #[test]
    fn from_tick_places_sequence_and_shard() {
        let id = from_tick((7 << 10) | 5, Shard::new(3).unwrap());
        assert_eq!(decompose(id).unwrap(), Parts { ms: 7, shard: 3, seq: 5 });
    }

    #[test]
    fn timestamps_convert_both_ways_rounding_down() {
        let epoch = parse_epoch("2026-01-01").unwrap();
        assert_eq!(epoch, 1_767_225_600_000);
        // 2026-01-01 00:00:00.0015 UTC in PostgreSQL microseconds.
        let ts = (epoch * 1000 + 1500) - PG_EPOCH_UNIX_US;
        assert_eq!(ms_of_timestamptz(ts, epoch), Ok(1));
        assert_eq!(timestamptz_of_ms(1, epoch), ts - 500);
        assert_eq!(ms_of_timestamptz(ts - 2000, epoch), Err(CoreError::TimeOutOfRange));
        assert_eq!(ms_of_timestamptz(i64::MAX, epoch), Err(CoreError::TimeOutOfRange));
        assert_eq!(ms_of_timestamptz(i64::MIN, epoch), Err(CoreError::TimeOutOfRange));
        // The latest finite timestamptz (294276 AD) does not overflow.
        assert_eq!(ms_of_timestamptz(9_223_371_331_199_999_999, epoch), Err(CoreError::TimeOutOfRange));
        assert!(unix_ms_of_timestamptz(i64::MAX) > 0);
        let last = timestamptz_of_ms(MAX_MS, epoch);
        assert_eq!(ms_of_timestamptz(last + 999, epoch), Ok(MAX_MS));
        assert_eq!(ms_of_timestamptz(last + 1000, epoch), Err(CoreError::TimeOutOfRange));
    }

    #[test]
    fn timestamps_are_placed_against_the_range() {
        let epoch = parse_epoch("2026-01-01").unwrap();
        let start = timestamptz_of_ms(0, epoch);
        assert_eq!(place_timestamptz(start - 1, epoch), Placed::Before);
        assert_eq!(place_timestamptz(i64::MIN, epoch), Placed::Before);
        assert_eq!(place_timestamptz(start, epoch), Placed::Within(0));
        assert_eq!(place_timestamptz(timestamptz_of_ms(MAX_MS, epoch) + 1000, epoch), Placed::After);
        assert_eq!(place_timestamptz(i64::MAX, epoch), Placed::After);
    }

    #[test]
    fn epoch_forms() {
        let e = 1_735_689_600_000;
        for s in ["2025-01-01", "2025-01-01 00:00", "2025-01-01 00:00:00", "2025-01-01T00:00:00Z", "2025-01-01 00:00:00+00", " 2025-01-01 00:00:00 UTC"] {
            assert_eq!(parse_epoch(s), Some(e), "{s}");
        }
        assert_eq!(parse_epoch("1970-01-01"), Some(0));
        assert_eq!(parse_epoch("2024-02-29 12:30:15"), Some(1_709_209_815_000));
        for s in ["", "2025", "2025-13-01", "2023-02-29", "2025-01-01 24:00", "2025-01-01+01", "yesterday", "2025-1-01"] {
            assert_eq!(parse_epoch(s), None, "{s}");
        }
    }
}
