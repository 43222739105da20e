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
//! rand_b comes from a per-backend CSPRNG. The layout arithmetic is in
//! `core::uuid_layout`.

use std::sync::atomic::{AtomicU64, Ordering};

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::core::error::CoreError;
use crate::core::generator::{self, Unreserved};
use crate::core::layout;
use crate::core::uuid_layout::{self, UUID_TICKS};
use crate::errors::{IdError, OrRaise};
use crate::mark::{self, DbReservation};
use crate::{clock, random, settings, shared};

/// The UUID of a tick and 62 random bits.
fn from_tick(tick: u64, rand: u64) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(uuid_layout::bytes_of_tick(tick, rand))
}

/// This backend's own generator: the only one without the preload, and in
/// read-only transactions (where the mark cannot be written) the one that
/// continues above everything this backend handed out before.
static LOCAL: AtomicU64 = AtomicU64::new(0);
/// The backend has minted from `LOCAL` while preloaded: its shared mints
/// must now stay above it too.
static LOCAL_USED: BackendLocal<bool> = BackendLocal::new(false);

fn now_tick() -> Result<u64, CoreError> {
    uuid_layout::tick_of_unix_us(clock::unix_us()).map_err(|_| CoreError::ClockOutOfRange)
}

/// A new version-7 UUID, larger than every one minted before on this server.
/// Without the preload, or in a read-only transaction (a hot standby, say),
/// where the high-water mark cannot be written: larger than every one minted
/// before in this backend. Either way, strictly increasing within a backend.
#[pg_extern(volatile, parallel_unsafe)]
fn uuid_v7() -> pgrx::Uuid {
    let lead = settings::max_clock_lead_ms();
    let tick = match shared::state() {
        Ok(state) if !mark::read_only() => {
            if LOCAL_USED.get() {
                // Continue above what read-only transactions handed out.
                state.uuid.last.fetch_max(LOCAL.load(Ordering::Relaxed), Ordering::AcqRel);
            }
            let minted =
                generator::mint(&state.uuid.last, UUID_TICKS, lead, &DbReservation::loaded(0), now_tick, clock::sleep_ms)
                    .or_raise();
            state.uuid.record(&minted, UUID_TICKS, settings::track_status());
            if LOCAL_USED.get() {
                LOCAL.fetch_max(minted.tick, Ordering::Relaxed);
            }
            minted.tick
        }
        Ok(state) => {
            // Read-only: continue above this backend's last shared value, too
            // (and above no held mark: see mark::check_held).
            mark::check_held();
            LOCAL_USED.set(true);
            LOCAL.fetch_max(state.uuid.last.load(Ordering::Acquire), Ordering::Relaxed);
            generator::mint(&LOCAL, UUID_TICKS, lead, &Unreserved, now_tick, clock::sleep_ms).or_raise().tick
        }
        Err(_) => generator::mint(&LOCAL, UUID_TICKS, lead, &Unreserved, now_tick, clock::sleep_ms).or_raise().tick,
    };
    from_tick(tick, random::next_u64())
}

/// A version-7 UUID carrying the given time (for backfilling and tests).
#[pg_extern(volatile, parallel_safe, strict, name = "uuid_v7")]
fn uuid_v7_at(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    let tick = unix_us_of(ts).and_then(uuid_layout::tick_of_unix_us).map_err(out_of_range).or_raise();
    from_tick(tick, random::next_u64())
}

/// A time a UUIDv7 cannot carry: before 1970, past its 48 bits of milliseconds, or infinite.
fn out_of_range(_: CoreError) -> IdError {
    IdError::TimeOutOfRangeFor { what: "a UUIDv7".into(), range: Some((0, UUID_TICKS.max_ms)) }
}

fn unix_us_of(ts: TimestampWithTimeZone) -> Result<i64, CoreError> {
    let us: i64 = ts.into();
    if !ts.is_finite() {
        return Err(CoreError::TimeOutOfRange);
    }
    Ok(layout::unix_ms_of_timestamptz(us) * 1000 + us.rem_euclid(1000))
}

/// The time carried by a version-7 UUID, to the millisecond; NULL for other versions.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_ts(u: pgrx::Uuid) -> Option<TimestampWithTimeZone> {
    let ms = uuid_layout::unix_ms(u.as_bytes())?;
    TimestampWithTimeZone::try_from(layout::timestamptz_of_ms(ms, 0)).ok()
}

fn bound(ts: TimestampWithTimeZone, upper: bool) -> Result<pgrx::Uuid, CoreError> {
    let (lo, hi) = uuid_layout::bounds_of_tick(unix_us_of(ts).and_then(uuid_layout::tick_of_unix_us)?);
    Ok(pgrx::Uuid::from_bytes(if upper { hi } else { lo }))
}

/// The smallest version-7 UUID of the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_lower_bound(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    bound(ts, false).map_err(out_of_range).or_raise()
}

/// The largest version-7 UUID of the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_upper_bound(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    bound(ts, true).map_err(out_of_range).or_raise()
}

/// `uuid_v7_lower_bound` for any time: the nil UUID before 1970, the max UUID past the 48-bit range.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_lower_bound_clamped(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    bound(ts, false).unwrap_or_else(|_| clamp_side(ts))
}

/// `uuid_v7_upper_bound` for any time: the nil UUID before 1970, the max UUID past the 48-bit range.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_v7_upper_bound_clamped(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    bound(ts, true).unwrap_or_else(|_| clamp_side(ts))
}

fn clamp_side(ts: TimestampWithTimeZone) -> pgrx::Uuid {
    if ts.is_neg_infinity() || layout::unix_ms_of_timestamptz(ts.into()) < 0 {
        pgrx::Uuid::from_bytes([0; 16])
    } else {
        pgrx::Uuid::from_bytes([0xff; 16])
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn range_errors_describe_the_uuid_range() {
        let want = "22008: timestamp out of range for a UUIDv7 / \
                    A UUIDv7 carries a time from 1970-01-01 00:00:00.000 UTC to 10889-08-02 05:31:50.655 UTC.";
        for expr in [
            "uuid_v7('infinity')",
            "uuid_v7('1969-12-31 23:59:59+00')",
            "uuid_v7_lower_bound('-infinity')",
            "uuid_v7_upper_bound('10889-08-02 05:31:50.656+00')",
        ] {
            assert_eq!(crate::testing::error_of(expr), want, "{expr}");
        }
    }

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
    fn read_only_transactions_continue_above_the_last_uuid() {
        // Far ahead of the clock: 300,000 values in one statement borrow time.
        let last: pgrx::Uuid =
            one("SELECT u FROM (SELECT uuid_v7() AS u FROM generate_series(1, 300000)) s ORDER BY u DESC LIMIT 1");
        Spi::run("SET transaction_read_only = on").unwrap();
        let ro: pgrx::Uuid = one("SELECT uuid_v7()");
        assert!(ro.as_bytes() > last.as_bytes(), "{ro} after {last}");
        let bad: i64 = one(
            "SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY n) AS prev
               FROM (SELECT n, uuid_v7() AS u FROM generate_series(1, 1000) n) s) t WHERE u <= prev",
        );
        assert_eq!(bad, 0);
    }

    /// PostgreSQL 18's own uuidv7(): its values decode with ours, to the
    /// millisecond its uuid_extract_timestamp() gives, and so do ours.
    #[cfg(feature = "pg18")]
    #[pg_test]
    fn core_uuidv7_and_ours_decode_alike() {
        let bad: i64 = one(
            "SELECT count(*) FROM (
                 SELECT uuidv7() AS u FROM generate_series(1, 20000)
                 UNION ALL SELECT uuidv7(g * interval '-1 day') FROM generate_series(1, 20000) g
                 UNION ALL SELECT uuid_v7() FROM generate_series(1, 20000)
                 UNION ALL SELECT uuid_v7('1970-01-01 00:00:00.001+00'::timestamptz + g * interval '1 day 1 ms') FROM generate_series(1, 20000) g) s
              WHERE uuid_v7_ts(u) IS DISTINCT FROM date_trunc('milliseconds', uuid_extract_timestamp(u))
                 OR uuid_extract_version(u) <> 7",
        );
        assert_eq!(bad, 0);
        assert!(one::<bool>("SELECT uuid_v7_ts(gen_random_uuid()) IS NULL AND uuid_extract_timestamp(gen_random_uuid()) IS NULL"));
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
