//! The wall clock as the generators read it, and how they wait for it.

use std::time::{SystemTime, UNIX_EPOCH};

use pgrx::{check_for_interrupts, pg_sys};

/// Microseconds since 1970-01-01 UTC. A clock set before 1970 reads as 0,
/// which every generator then rejects as out of its range.
#[inline]
pub fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// Sleeps until the clock has moved on by `ms` milliseconds (reaching the
/// start of the millisecond `ms` after the current one), answering cancel
/// requests.
pub fn sleep_ms(ms: i64) {
    check_for_interrupts!();
    let to_next_ms = 1000 - unix_us().rem_euclid(1000);
    // SAFETY: pg_usleep only sleeps the calling process.
    unsafe { pg_sys::pg_usleep((ms.clamp(1, 1000) - 1) * 1000 + to_next_ms) };
    check_for_interrupts!();
}
