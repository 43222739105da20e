//! The wall clock as the generators read it, and how they wait for it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgrx::prelude::*;
use pgrx::{check_for_interrupts, pg_sys};

use crate::errors::{IdError, OrRaise};

/// Microseconds since 1970-01-01 UTC. A clock set before 1970 reads as 0,
/// which every generator then rejects as out of its range.
#[inline]
pub fn unix_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// The last stretch of a wait is spent reading the clock rather than
/// sleeping: a sleep overshoots by tens of microseconds, which a shard waiting
/// for its next millisecond would lose of it.
const SPIN_US: i64 = 150;

/// Waits until the clock reaches the start of the millisecond `ms` after the
/// current one, answering cancel requests. Bounded in time even when the
/// clock does not move (the spin is timed by the monotonic clock).
pub fn sleep_ms(ms: i64) {
    check_for_interrupts!();
    let now = unix_us();
    let target = (now.div_euclid(1000) + ms.clamp(1, 1000)) * 1000;
    if target - now > SPIN_US {
        // SAFETY: pg_usleep only sleeps the calling process.
        unsafe { pg_sys::pg_usleep(target - now - SPIN_US) };
    }
    let spin_until = Instant::now() + Duration::from_micros(2 * SPIN_US as u64);
    while unix_us() < target && Instant::now() < spin_until {
        std::hint::spin_loop();
    }
    check_for_interrupts!();
}

/// A `timestamptz` from PostgreSQL microseconds (every time an ID or UUID
/// can carry is one; anything else is out of range).
pub fn timestamptz(us: i64) -> TimestampWithTimeZone {
    TimestampWithTimeZone::try_from(us).map_err(|_| IdError::TimeOutOfRange).or_raise()
}

/// Nanoseconds of CLOCK_MONOTONIC_COARSE: never steps with the wall
/// clock, the same in every process (so that a deadline one process sets in
/// shared memory holds for all, see `lease`), and read from memory without
/// a clock read proper (a few ns, where CLOCK_MONOTONIC costs about 25). It
/// lags the true monotonic time by up to its resolution ([`coarse_res_ns`]).
#[inline]
pub fn coarse_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes only `ts`; the clock exists on every Linux PostgreSQL runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The resolution of [`coarse_ns`] (a tick of the kernel, 1 to 10 ms).
pub fn coarse_res_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes only `ts`.
    unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64).max(1)
}
