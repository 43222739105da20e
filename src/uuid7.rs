//! RFC 9562 UUIDv7: minting, backfill, decoding and range bounds.
//!
//! ```text
//!  48-bit Unix ms | ver 0111 | 12-bit rand_a | var 10 | 62-bit rand_b
//! ```
//! rand_a holds a 12-bit sub-millisecond fraction of the clock, and counts up
//! from there when values come faster than the clock (RFC 9562 section 6.2,
//! methods 3 and 1 together): `ms << 12 | rand_a` is a generator tick, so the
//! generator of the 64-bit IDs also orders UUIDs. With the library preloaded
//! one shared tick orders every backend's values; without it, each backend's.
//! rand_b comes from a per-backend CSPRNG.

use std::sync::atomic::AtomicU64;

use pgrx::prelude::*;
use uuid::{Builder, Variant, Version};

use crate::errors::{IdError, OrRaise};
use crate::durable::DbReservation;
use crate::generator::{self, TickFormat, Unreserved};
use crate::{clock, layout, random, settings, shared};

const RAND_A_BITS: u32 = 12;
pub const TICKS: TickFormat = TickFormat { bits: RAND_A_BITS, max_ms: (1 << 48) - 1 };

/// The tick of a Unix time in microseconds: ms and a 12-bit fraction of it.
fn tick_of_unix_us(us: i64) -> Result<u64, IdError> {
    let ms = us.div_euclid(1000);
    if !(0..=TICKS.max_ms).contains(&ms) {
        return Err(IdError::TimeOutOfRange);
    }
    let fraction = (us.rem_euclid(1000) << RAND_A_BITS) / 1000;
    Ok(((ms as u64) << RAND_A_BITS) | fraction as u64)
}

/// The UUID of a tick and 62 random bits (the top two of `rand` are unused).
fn from_tick(tick: u64, rand: u64) -> pgrx::Uuid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&((tick >> RAND_A_BITS) << 16 | (tick & 0xfff)).to_be_bytes());
    b[8..].copy_from_slice(&rand.to_be_bytes());
    let u = Builder::from_bytes(b).with_version(Version::SortRand).with_variant(Variant::RFC4122).into_uuid();
    pgrx::Uuid::from_bytes(*u.as_bytes())
}

/// The Unix millisecond of a version-7 UUID, or None for other versions.
fn unix_ms(u: &pgrx::Uuid) -> Option<i64> {
    let u = uuid::Uuid::from_bytes(*u.as_bytes());
    if u.get_version_num() != 7 || u.get_variant() != Variant::RFC4122 {
        return None;
    }
    let b = u.as_bytes();
    Some(b[..6].iter().fold(0i64, |acc, &x| (acc << 8) | x as i64))
}

/// Per-backend state, for servers that did not preload the library.
static LOCAL: AtomicU64 = AtomicU64::new(0);

fn now_tick() -> Result<u64, IdError> {
    tick_of_unix_us(clock::unix_us()).map_err(|_| IdError::ClockOutOfRange)
}

/// A new version-7 UUID, larger than every one minted before on this server.
/// Without the preload, or in a read-only transaction (a hot standby, say),
/// where the high-water mark cannot be written: larger than every one minted
/// before in this backend.
#[pg_extern(volatile, parallel_unsafe)]
fn uuid_v7() -> pgrx::Uuid {
    let lead = settings::max_clock_lead_ms();
    // SAFETY: reads a plain global flag of this backend.
    let read_only = unsafe { pg_sys::XactReadOnly };
    let tick = match shared::state() {
        Ok(state) if !read_only => {
            let minted = generator::mint(&state.uuid.last, TICKS, lead, &DbReservation::current(0), now_tick, clock::sleep_ms)
                .or_raise();
            state.uuid.record(&minted, TICKS);
            minted.tick
        }
        _ => generator::mint(&LOCAL, TICKS, lead, &Unreserved, now_tick, clock::sleep_ms).or_raise().tick,
    };
    from_tick(tick, random::next_u64())
}

/// A version-7 UUID carrying the given time (for backfilling and tests).
#[pg_extern(volatile, parallel_safe, strict, name = "uuid_v7")]
fn uuid_v7_at(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    let tick = unix_us_of(ts).and_then(tick_of_unix_us).or_raise();
    from_tick(tick, random::next_u64())
}

fn unix_us_of(ts: TimestampWithTimeZone) -> Result<i64, IdError> {
    let us: i64 = ts.into();
    if !ts.is_finite() {
        return Err(IdError::TimeOutOfRange);
    }
    Ok(layout::unix_ms_of_timestamptz(us) * 1000 + us.rem_euclid(1000))
}

/// The time carried by a version-7 UUID, to the millisecond; NULL for other versions.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_ts(u: pgrx::Uuid) -> Option<TimestampWithTimeZone> {
    let ms = unix_ms(&u)?;
    TimestampWithTimeZone::try_from(layout::timestamptz_of_ms(ms, 0)).ok()
}

/// The smallest version-7 UUID of the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_lower_bound(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    let tick = unix_us_of(ts).and_then(tick_of_unix_us).or_raise();
    from_tick(tick >> RAND_A_BITS << RAND_A_BITS, 0)
}

/// The largest version-7 UUID of the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_upper_bound(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    let tick = unix_us_of(ts).and_then(tick_of_unix_us).or_raise();
    from_tick(tick | 0xfff, u64::MAX)
}

/// `uuid_v7_lower_bound` for any time: the nil UUID before 1970, the max UUID past the 48-bit range.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_lower_bound_clamped(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    match unix_us_of(ts).and_then(tick_of_unix_us) {
        Ok(tick) => from_tick(tick >> RAND_A_BITS << RAND_A_BITS, 0),
        Err(_) => clamp_side(ts),
    }
}

/// `uuid_v7_upper_bound` for any time: the nil UUID before 1970, the max UUID past the 48-bit range.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_upper_bound_clamped(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    match unix_us_of(ts).and_then(tick_of_unix_us) {
        Ok(tick) => from_tick(tick | 0xfff, u64::MAX),
        Err(_) => clamp_side(ts),
    }
}

fn clamp_side(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    if ts.is_neg_infinity() || layout::unix_ms_of_timestamptz(ts.into()) < 0 {
        pgrx::Uuid::from_bytes([0; 16])
    } else {
        pgrx::Uuid::from_bytes([0xff; 16])
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn ticks_carry_ms_and_a_fraction() {
        assert_eq!(tick_of_unix_us(1_500), Ok((1 << 12) | 2048));
        assert_eq!(tick_of_unix_us(999), Ok(4091));
        assert_eq!(tick_of_unix_us(-1), Err(IdError::TimeOutOfRange));
        assert_eq!(tick_of_unix_us(((1 << 48) - 1) * 1000 + 999), Ok(((1 << 48) - 1) << 12 | 4091));
        assert_eq!(tick_of_unix_us((1 << 48) * 1000), Err(IdError::TimeOutOfRange));
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn version_and_variant_bits_on_many_values() {
        let bad: i64 = one(
            "SELECT count(*) FROM (SELECT uuid_v7()::text AS u FROM generate_series(1, 20000)) s
              WHERE substr(u, 15, 1) <> '7' OR substr(u, 20, 1) NOT IN ('8', '9', 'a', 'b')",
        );
        assert_eq!(bad, 0);
    }

    #[pg_test]
    fn strictly_increasing_within_a_statement() {
        let bad: i64 = one(
            "SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY n) AS prev
               FROM (SELECT n, uuid_v7() AS u FROM generate_series(1, 100000) n) s) t WHERE u <= prev",
        );
        assert_eq!(bad, 0);
    }

    #[pg_test]
    fn carries_the_current_time() {
        let ok: bool = one(
            "WITH x AS MATERIALIZED (SELECT clock_timestamp() AS before, uuid_v7() AS u)
             SELECT uuid_v7_ts(u) BETWEEN date_trunc('milliseconds', before) AND clock_timestamp() FROM x",
        );
        assert!(ok);
    }

    #[pg_test]
    fn backfill_round_trips_to_the_millisecond() {
        assert_eq!(
            one::<String>("SELECT uuid_v7_ts(uuid_v7('2021-06-07 08:09:10.123456+00'))::text"),
            "2021-06-07 08:09:10.123+00"
        );
        assert_eq!(one::<String>("SELECT uuid_v7_ts(uuid_v7('1970-01-01 00:00:00+00'))::text"), "1970-01-01 00:00:00+00");
        assert_eq!(
            one::<String>("SELECT left(uuid_v7('2021-06-07 08:09:10.123456+00')::text, 15)"),
            "0179e584-b4eb-7"
        );
        assert!(one::<bool>(
            "SELECT uuid_v7('2021-06-07 08:09:10.1+00') <> uuid_v7('2021-06-07 08:09:10.1+00')"
        ));
    }

    #[pg_test]
    fn not_version_7_gives_null() {
        for u in ["gen_random_uuid()", "'00000000-0000-0000-0000-000000000000'", "'0179e584-b4eb-7000-c000-000000000000'"] {
            // The last has the version 7 nibble but not the RFC 9562 variant.
            assert!(one::<bool>(&format!("SELECT uuid_v7_ts({u}) IS NULL")), "{u}");
        }
    }

    #[pg_test]
    fn bounds_enclose_values_of_their_millisecond() {
        assert_eq!(
            one::<String>("SELECT uuid_v7_lower_bound('2021-06-07 08:09:10.123456+00')::text"),
            "0179e584-b4eb-7000-8000-000000000000"
        );
        assert_eq!(
            one::<String>("SELECT uuid_v7_upper_bound('2021-06-07 08:09:10.123456+00')::text"),
            "0179e584-b4eb-7fff-bfff-ffffffffffff"
        );
        let inside: i64 = one(
            "SELECT count(*) FROM generate_series(0, 999) us,
                    LATERAL (SELECT '2021-06-07 08:09:10.123+00'::timestamptz + us * interval '1 microsecond' AS ts) t
              WHERE uuid_v7(ts) BETWEEN uuid_v7_lower_bound(ts) AND uuid_v7_upper_bound(ts)
                AND uuid_v7(ts) > uuid_v7_upper_bound(ts - interval '1 millisecond')
                AND uuid_v7(ts) < uuid_v7_lower_bound(ts + interval '1 millisecond')",
        );
        assert_eq!(inside, 1000);
        let now_inside: bool = one(
            "WITH x AS MATERIALIZED (SELECT uuid_v7() AS u) SELECT u BETWEEN uuid_v7_lower_bound(uuid_v7_ts(u)) AND uuid_v7_upper_bound(uuid_v7_ts(u)) FROM x",
        );
        assert!(now_inside);
    }

    #[pg_test]
    fn out_of_range_times_are_22008() {
        for sql in [
            "uuid_v7('1969-12-31 23:59:59.999+00')",
            "uuid_v7('infinity')",
            "uuid_v7_lower_bound('-infinity')",
            "uuid_v7_upper_bound('10890-01-01+00')",
        ] {
            assert_eq!(sqlstate(sql), "22008", "{sql}");
        }
    }

    #[pg_test]
    fn uuid_functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(p.oid::regprocedure::text || ':' || provolatile::text || proparallel::text, ' ' ORDER BY p.oid::regprocedure::text)
               FROM pg_proc p WHERE proname LIKE 'uuid_v7%'",
        );
        assert_eq!(
            rows,
            "uuid_v7():vu uuid_v7(timestamp with time zone):vs uuid_v7_lower_bound(timestamp with time zone):is \
             uuid_v7_lower_bound_clamped(timestamp with time zone):is uuid_v7_ts(uuid):is \
             uuid_v7_upper_bound(timestamp with time zone):is uuid_v7_upper_bound_clamped(timestamp with time zone):is"
        );
    }
}
