//! The per-shard state machine, in plain Rust (no pgrx types).
//!
//! A generator's whole state is one `u64` *tick*: `ms << bits | counter`,
//! where `ms` counts milliseconds since the generator's epoch and `counter`
//! numbers the values handed out within that millisecond. Every value handed
//! out is a tick larger than the last one, so values never repeat and always
//! increase. Given the last tick and a clock reading, [`step`] decides the next
//! tick, a short wait, or an error; [`mint`] applies it to a shared atomic with
//! compare-and-swap, so any number of backends can mint without a lock. A
//! [`Reservation`] says up to which millisecond values are covered by a
//! persisted high-water mark; past it, `mint` has it extended first.

use std::sync::atomic::{AtomicU64, Ordering};

use super::error::CoreError;

/// The state of a generator whose shard was released to another server:
/// nothing more is handed out from it.
pub const RETIRED: u64 = u64::MAX;

/// How ticks are laid out for one kind of value.
#[derive(Clone, Copy, Debug)]
pub struct TickFormat {
    /// Low bits counting values within one millisecond.
    pub bits: u32,
    /// The largest millisecond the value can carry.
    pub max_ms: i64,
}

/// The longest a mint call waits, in total, for the clock to catch up before
/// it gives up with an error. Waiting is only ever needed when the lead bound
/// is nearly used (a full millisecond with `max_clock_lead_ms = 0`, say).
pub const MAX_WAIT_MS: i64 = 1000;

/// How many times one mint call may extend the reservation: once is the
/// rule, a second when another backend raced ahead meanwhile.
pub const MAX_EXTENSIONS: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Hand out this tick.
    Take(u64),
    /// Nothing may be handed out until the clock moves on by this many ms.
    Wait(i64),
}

/// What one successful mint saw, for the status counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Minted {
    /// The tick handed out.
    pub tick: u64,
    /// The tick handed out before it.
    pub prev: u64,
    /// The clock, as a tick, when it was handed out.
    pub now: u64,
    /// The call slept for the clock to catch up.
    pub waited: bool,
}

impl Minted {
    /// The value opened a new millisecond ahead of the clock: one borrowed millisecond.
    pub fn borrowed_ms(&self, fmt: TickFormat) -> bool {
        let ms = self.tick >> fmt.bits;
        ms > self.prev >> fmt.bits && ms > self.now >> fmt.bits
    }
}

/// Up to which millisecond values may be handed out: a high-water mark
/// persisted ahead of them, so that a restart never hands them out again.
pub trait Reservation {
    /// Values of millisecond `ms` (in the generator's units) are covered.
    fn covers(&self, ms: i64) -> bool;
    /// Extends the reservation to cover `ms`. It may raise the generator's
    /// state (to a floor recovered from disk), so the caller starts over.
    fn extend(&self, ms: i64) -> Result<(), CoreError>;
}

/// No persistence: every value is covered.
pub struct Unreserved;

impl Reservation for Unreserved {
    fn covers(&self, _ms: i64) -> bool {
        true
    }
    fn extend(&self, _ms: i64) -> Result<(), CoreError> {
        Ok(())
    }
}

/// Raises a generator's state so that its next value lies in millisecond
/// `ms` or later (a floor recovered from a persisted mark).
pub fn raise_floor(cell: &AtomicU64, fmt: TickFormat, ms: i64) {
    if ms > 0 {
        cell.fetch_max(floor_tick(fmt, ms), Ordering::AcqRel);
    }
}

/// The tick just below millisecond `ms` (> 0). A millisecond past the
/// format's range stops at the end of the range, whose next value is an
/// error (`ClockOutOfRange`): never a shift that wraps around.
fn floor_tick(fmt: TickFormat, ms: i64) -> u64 {
    ((ms.min(fmt.max_ms + 1) as u64) << fmt.bits) - 1
}

/// Raises a generator's state to `tick` (an ID it must stay above), unless
/// it is retired: a released shard stays released.
pub fn raise_to(cell: &AtomicU64, tick: u64) {
    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| (cur != RETIRED && cur < tick).then_some(tick));
}

/// Like [`raise_floor`], and also brings a retired generator back (a
/// shard whose lease this server is granted again, see `lease`).
pub fn revive_above(cell: &AtomicU64, fmt: TickFormat, ms: i64) {
    let floor = if ms > 0 { floor_tick(fmt, ms) } else { 0 };
    let _ = cell.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        Some(if cur == RETIRED { floor } else { cur.max(floor) })
    });
}

/// Decides the next tick after `last`, given the clock as a tick `now`.
///
/// The next tick is the larger of `last + 1` and `now`: at the clock when the
/// clock is ahead, else one more than the last value (moving into the next
/// millisecond when this one's counter is used up). Its millisecond may run
/// ahead of the clock by at most `max_lead_ms`; a little beyond that it waits,
/// further beyond it is an error. It never goes back.
#[inline]
pub fn step(last: u64, now: u64, fmt: TickFormat, max_lead_ms: i64) -> Result<Step, CoreError> {
    if last == RETIRED {
        return Err(CoreError::ShardReleased(None));
    }
    let next = last.saturating_add(1).max(now);
    let next_ms = (next >> fmt.bits) as i64;
    if next_ms > fmt.max_ms {
        return Err(CoreError::ClockOutOfRange);
    }
    let ahead = next_ms - (now >> fmt.bits) as i64;
    if ahead <= max_lead_ms {
        Ok(Step::Take(next))
    } else if ahead - max_lead_ms <= MAX_WAIT_MS {
        Ok(Step::Wait(ahead - max_lead_ms))
    } else {
        Err(CoreError::ClockBehind { shard: None, ahead_ms: ahead, max_lead_ms })
    }
}

/// Mints the next tick of the generator whose state is `cell`.
///
/// `clock` returns the current time as a tick (or an error when it is out of
/// range); `sleep` waits about the given number of milliseconds. The loop
/// retries only when another backend won the compare-and-swap (progress was
/// made), after a wait, or after extending the reservation; total waiting is
/// bounded by [`MAX_WAIT_MS`], extensions by [`MAX_EXTENSIONS`].
#[inline]
pub fn mint(
    cell: &AtomicU64,
    fmt: TickFormat,
    max_lead_ms: i64,
    reservation: &impl Reservation,
    mut clock: impl FnMut() -> Result<u64, CoreError>,
    mut sleep: impl FnMut(i64),
) -> Result<Minted, CoreError> {
    let mut last = cell.load(Ordering::Acquire);
    let mut waited_ms = 0;
    let mut extensions = 0;
    loop {
        let now = clock()?;
        match step(last, now, fmt, max_lead_ms)? {
            Step::Take(tick) if !reservation.covers((tick >> fmt.bits) as i64) => {
                if extensions == MAX_EXTENSIONS {
                    return Err(CoreError::Internal("the high-water mark did not cover the next value".into()));
                }
                extensions += 1;
                reservation.extend((tick >> fmt.bits) as i64)?;
                last = cell.load(Ordering::Acquire);
            }
            Step::Take(tick) => match cell.compare_exchange_weak(last, tick, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Minted { tick, prev: last, now, waited: waited_ms > 0 }),
                Err(seen) => last = seen,
            },
            Step::Wait(ms) if waited_ms < MAX_WAIT_MS => {
                sleep(ms);
                waited_ms += ms;
                last = cell.load(Ordering::Acquire);
            }
            Step::Wait(ms) => {
                return Err(CoreError::ClockBehind { shard: None, ahead_ms: ms + max_lead_ms, max_lead_ms });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::collections::HashSet;
    use std::sync::Arc;

    const FMT: TickFormat = TickFormat { bits: 10, max_ms: (1 << 41) - 1 };

    fn t(ms: u64, seq: u64) -> u64 {
        (ms << 10) | seq
    }

    #[test]
    fn raise_to_raises_but_leaves_a_retired_generator_retired() {
        let cell = AtomicU64::new(t(500, 3));
        raise_to(&cell, t(600, 7));
        assert_eq!(cell.load(Ordering::Relaxed), t(600, 7));
        raise_to(&cell, t(550, 0));
        assert_eq!(cell.load(Ordering::Relaxed), t(600, 7), "never lowered");
        cell.store(RETIRED, Ordering::Relaxed);
        raise_to(&cell, t(700, 0));
        assert_eq!(cell.load(Ordering::Relaxed), RETIRED);
    }

    #[test]
    fn revive_above_raises_and_brings_back_a_retired_generator() {
        let cell = AtomicU64::new(RETIRED);
        revive_above(&cell, FMT, 500);
        assert_eq!(cell.load(Ordering::Relaxed), t(499, 1023));
        revive_above(&cell, FMT, 400);
        assert_eq!(cell.load(Ordering::Relaxed), t(499, 1023), "never lowered");
        cell.store(t(600, 3), Ordering::Relaxed);
        revive_above(&cell, FMT, 500);
        assert_eq!(cell.load(Ordering::Relaxed), t(600, 3));
    }

    #[test]
    fn first_value_of_a_millisecond_is_counter_zero() {
        assert_eq!(step(0, t(500, 0), FMT, 0), Ok(Step::Take(t(500, 0))));
        assert_eq!(step(t(499, 7), t(500, 0), FMT, 0), Ok(Step::Take(t(500, 0))));
    }

    #[test]
    fn same_millisecond_counts_up() {
        assert_eq!(step(t(500, 0), t(500, 0), FMT, 0), Ok(Step::Take(t(500, 1))));
        assert_eq!(step(t(500, 1022), t(500, 0), FMT, 0), Ok(Step::Take(t(500, 1023))));
    }

    #[test]
    fn full_millisecond_borrows_the_next_within_the_lead() {
        assert_eq!(step(t(500, 1023), t(500, 0), FMT, 1), Ok(Step::Take(t(501, 0))));
    }

    #[test]
    fn full_millisecond_waits_without_lead() {
        assert_eq!(step(t(500, 1023), t(500, 0), FMT, 0), Ok(Step::Wait(1)));
    }

    #[test]
    fn clock_back_within_the_lead_continues_above_the_last_value() {
        assert_eq!(step(t(10_000, 3), t(9_000, 0), FMT, 5_000), Ok(Step::Take(t(10_000, 4))));
    }

    #[test]
    fn clock_back_past_the_lead_is_an_error_not_a_wrap() {
        assert_eq!(
            step(t(10_000, 3), t(5_000, 0), FMT, 1_000),
            Err(CoreError::ClockBehind { shard: None, ahead_ms: 5_000, max_lead_ms: 1_000 })
        );
        // A little past the lead: wait for the clock instead.
        assert_eq!(step(t(10_000, 3), t(8_500, 0), FMT, 1_000), Ok(Step::Wait(500)));
    }

    #[test]
    fn a_retired_generator_hands_out_nothing() {
        assert_eq!(step(RETIRED, t(5, 0), FMT, 10), Err(CoreError::ShardReleased(None)));
        let cell = AtomicU64::new(RETIRED);
        raise_floor(&cell, FMT, 1_000);
        assert_eq!(cell.load(Ordering::Relaxed), RETIRED, "a recovered floor does not revive it");
    }

    #[test]
    fn a_floor_past_the_range_ends_the_range_and_never_wraps() {
        let fmt = TickFormat { bits: 10, max_ms: 1000 };
        for ms in [1001, 1_000_000, i64::MAX / 1000, i64::MAX] {
            let cell = AtomicU64::new(t(5, 0));
            raise_floor(&cell, fmt, ms);
            assert_eq!(cell.load(Ordering::Relaxed), t(1001, 0) - 1, "{ms}");
            assert_eq!(step(cell.load(Ordering::Relaxed), t(1000, 0), fmt, i64::MAX), Err(CoreError::ClockOutOfRange));
            let cell = AtomicU64::new(RETIRED);
            revive_above(&cell, fmt, ms);
            assert_eq!(cell.load(Ordering::Relaxed), t(1001, 0) - 1, "{ms}");
        }
        // The real formats: the end of the range fits in a tick.
        for fmt in [crate::core::layout::ID_TICKS, crate::core::uuid_layout::UUID_TICKS] {
            let cell = AtomicU64::new(0);
            raise_floor(&cell, fmt, i64::MAX);
            assert_eq!(cell.load(Ordering::Relaxed), (((fmt.max_ms + 1) as u64) << fmt.bits) - 1);
            assert_ne!(cell.load(Ordering::Relaxed), RETIRED);
        }
    }

    #[test]
    fn end_of_range_is_an_error() {
        assert_eq!(step(t(FMT.max_ms as u64, 1023), t(FMT.max_ms as u64, 0), FMT, 10), Err(CoreError::ClockOutOfRange));
    }

    #[test]
    fn mint_waits_on_a_full_millisecond_with_an_injected_clock() {
        let cell = AtomicU64::new(t(100, 1023));
        let now = Cell::new(100u64);
        let mut sleeps = vec![];
        let m = mint(&cell, FMT, 0, &Unreserved, || Ok(t(now.get(), 0)), |ms| {
            sleeps.push(ms);
            now.set(now.get() + ms as u64);
        })
        .unwrap();
        assert_eq!(m, Minted { tick: t(101, 0), prev: t(100, 1023), now: t(101, 0), waited: true });
        assert!(!m.borrowed_ms(FMT));
        assert_eq!(sleeps, vec![1]);
        assert_eq!(cell.load(Ordering::Relaxed), t(101, 0));
    }

    #[test]
    fn mint_with_a_frozen_clock_gives_up_after_bounded_waiting() {
        let cell = AtomicU64::new(t(100, 1023));
        let mut slept = 0;
        let r = mint(&cell, FMT, 0, &Unreserved, || Ok(t(100, 0)), |ms| slept += ms);
        assert!(matches!(r, Err(CoreError::ClockBehind { .. })), "{r:?}");
        assert!(slept >= MAX_WAIT_MS && slept <= MAX_WAIT_MS + 1, "{slept}");
        assert_eq!(cell.load(Ordering::Relaxed), t(100, 1023), "nothing handed out");
    }

    #[test]
    fn mint_reports_borrowed_milliseconds() {
        let cell = AtomicU64::new(t(1_000, 1023));
        let m = mint(&cell, FMT, 10_000, &Unreserved, || Ok(t(400, 0)), |_| unreachable!()).unwrap();
        assert_eq!(m, Minted { tick: t(1_001, 0), prev: t(1_000, 1023), now: t(400, 0), waited: false });
        assert!(m.borrowed_ms(FMT));
        let m = mint(&cell, FMT, 10_000, &Unreserved, || Ok(t(400, 0)), |_| unreachable!()).unwrap();
        assert!(!m.borrowed_ms(FMT), "the same borrowed millisecond counts once");
    }

    /// A reservation in memory that counts its extensions and may carry a
    /// recovered floor, as the persisted mark does.
    struct TestReservation<'a> {
        cell: &'a AtomicU64,
        reserved: Cell<i64>,
        floor: Cell<Option<i64>>,
        extensions: Cell<u32>,
    }

    impl Reservation for TestReservation<'_> {
        fn covers(&self, ms: i64) -> bool {
            ms <= self.reserved.get()
        }
        fn extend(&self, ms: i64) -> Result<(), CoreError> {
            if let Some(floor) = self.floor.take() {
                raise_floor(self.cell, FMT, floor);
            }
            self.extensions.set(self.extensions.get() + 1);
            self.reserved.set(self.reserved.get().max(ms) + 100);
            Ok(())
        }
    }

    #[test]
    fn values_past_the_reservation_extend_it_first_and_respect_a_recovered_floor() {
        let cell = AtomicU64::new(0);
        let r = TestReservation { cell: &cell, reserved: Cell::new(0), floor: Cell::new(Some(5_000)), extensions: Cell::new(0) };
        // The clock reads ms 4_000, behind the recovered floor of 5_000.
        let m = mint(&cell, FMT, 2_000, &r, || Ok(t(4_000, 0)), |_| unreachable!()).unwrap();
        assert_eq!(m.tick, t(5_000, 0), "the first value is at the floor, not at the clock");
        assert_eq!(r.extensions.get(), 2, "one extension to load the floor, one to cover it");
        assert_eq!(r.reserved.get(), 5_100);
        let (mut m, mut n) = (m, 0);
        while m.tick >> 10 <= 5_100 {
            assert_eq!(r.extensions.get(), 2, "no extension inside the reserved range");
            m = mint(&cell, FMT, 2_000, &r, || Ok(t(4_000, 0)), |_| unreachable!()).unwrap();
            n += 1;
            assert!(n <= 200_000);
        }
        assert_eq!(m.tick, t(5_101, 0));
        assert_eq!(r.extensions.get(), 3, "the next extension comes only past the reserved millisecond");
    }

    #[test]
    fn a_floor_beyond_the_lead_is_an_error_not_a_lower_value() {
        let cell = AtomicU64::new(0);
        let r = TestReservation { cell: &cell, reserved: Cell::new(0), floor: Cell::new(Some(600_000)), extensions: Cell::new(0) };
        let e = mint(&cell, FMT, 10_000, &r, || Ok(t(1_000, 0)), |_| {}).unwrap_err();
        assert_eq!(e, CoreError::ClockBehind { shard: None, ahead_ms: 599_000, max_lead_ms: 10_000 });
    }

    #[test]
    fn a_burst_runs_ahead_only_as_far_as_the_lead_allows() {
        // A clock stuck at ms 1, lead 3 ms: exactly 4 ms of values (4096), then an error.
        let cell = AtomicU64::new(0);
        let mut got = 0;
        let err = loop {
            match mint(&cell, FMT, 3, &Unreserved, || Ok(t(1, 0)), |_| {}) {
                Ok(_) => got += 1,
                Err(e) => break e,
            }
            assert!(got <= 5000);
        };
        assert_eq!(got, 4 * 1024);
        assert!(matches!(err, CoreError::ClockBehind { .. }));
    }

    #[test]
    fn threads_never_share_a_value_and_each_sees_increasing_values() {
        let cell = Arc::new(AtomicU64::new(0));
        let start = std::time::Instant::now();
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let cell = Arc::clone(&cell);
                std::thread::spawn(move || {
                    let mut seen = Vec::with_capacity(50_000);
                    for _ in 0..50_000 {
                        let ms = start.elapsed().as_millis() as u64;
                        let m = mint(&cell, FMT, 60_000, &Unreserved, || Ok(t(ms, 0)), |_| {}).unwrap();
                        seen.push(m.tick);
                    }
                    seen
                })
            })
            .collect();
        let mut all = HashSet::new();
        for h in handles {
            let seen = h.join().unwrap();
            assert!(seen.windows(2).all(|w| w[0] < w[1]));
            all.extend(seen);
        }
        assert_eq!(all.len(), 200_000);
    }
}
