//! The wall clock as the generators read it, and how they wait for it.

use std::time::{SystemTime, UNIX_EPOCH};

use pgrx::{check_for_interrupts, pg_sys};

/// Microseconds since 1970-01-01 UTC. A clock set before 1970 reads as 0,
/// which every generator then rejects as out of its range.
#[inline]
pub fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// Sleeps about `ms` milliseconds, answering cancel requests.
pub fn sleep_ms(ms: i64) {
    check_for_interrupts!();
    // SAFETY: pg_usleep only sleeps the calling process.
    unsafe { pg_sys::pg_usleep(ms.clamp(0, 1000) * 1000) };
    check_for_interrupts!();
}
