//! What the generators have done since the server started, for operators.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::core::generator::{TickFormat, RETIRED};
use crate::core::layout::{self, ID_TICKS, MAX_MS};
use crate::core::uuid_layout::UUID_TICKS;
use crate::errors::OrRaise;
use crate::clock::timestamptz;
use crate::mark;
use crate::shared::{self, Slot};
use crate::{clock, settings};

const MS_PER_YEAR: f64 = 365.25 * 86_400_000.0;

/// A slot's last value (epoch-relative ms, counter) and lead over the clock.
fn last_and_lead(slot: &Slot, fmt: TickFormat, now_ms: i64) -> (i64, i32, i64) {
    let last = slot.last.load(Ordering::Acquire);
    let ms = (last >> fmt.bits) as i64;
    (ms, (last & ((1 << fmt.bits) - 1)) as i32, (ms - now_ms).max(0))
}

// Each release's SQL binds the C symbol of the result shape it declares, as
// core extensions do (`pg_stat_statements_1_2`): `id_generator_status_0_2`
// (the shape since 0.2.0) and `id_generator_server_status_0_4` (since 0.4.0).
// SQL of a release newer than the library loaded (an update run before the
// restart) then fails with "could not find function" instead of reading
// columns past the end of what the older library returns. The unversioned
// symbols stay for the catalogs of 0.1.0 to 0.4.0, which bound them: their
// shapes are prefixes of today's, and PostgreSQL forms each row with the
// columns the catalog declares.

/// Exports a symbol that catalogs before 0.5.0 bind, with its V1 info
/// record, calling the function pgrx made for today's shape.
macro_rules! legacy_symbol {
    ($legacy:ident, $finfo:ident, $current:ident) => {
        #[no_mangle]
        #[doc(hidden)]
        pub unsafe extern "C-unwind" fn $legacy(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            // SAFETY: the same call, with the same call info, that PostgreSQL
            // would make to the current symbol (the function takes no arguments).
            unsafe { $current(fcinfo) }
        }

        #[no_mangle]
        #[doc(hidden)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            const V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };
            &V1
        }
    };
}

legacy_symbol!(id_generator_status_wrapper, pg_finfo_id_generator_status_wrapper, id_generator_status_0_2_wrapper);
legacy_symbol!(id_generator_server_status_wrapper, pg_finfo_id_generator_server_status_wrapper, id_generator_server_status_0_4_wrapper);

/// One row per logical shard that has minted since the server started, or
/// was released (then `released` is true and there is no last ID).
#[allow(clippy::type_complexity)]
#[pg_extern(name = "id_generator_status", volatile, parallel_safe)]
fn id_generator_status_0_2() -> TableIterator<
    'static,
    (
        name!(shard, i32),
        name!(last_ts, Option<TimestampWithTimeZone>),
        name!(last_seq, Option<i32>),
        name!(minted, i64),
        name!(full_ms_waits, i64),
        name!(borrowed_ms, i64),
        name!(clock_regressions, i64),
        name!(lead_ms, Option<i64>),
        name!(released, bool),
    ),
> {
    let state = shared::state().or_raise();
    let epoch = settings::configured_epoch_ms();
    let now_ms = clock::unix_us().div_euclid(1000) - epoch;
    let rows: Vec<_> = state
        .shards
        .iter()
        .enumerate()
        .filter(|(_, slot)| slot.last.load(Ordering::Acquire) != 0)
        .map(|(shard, slot)| {
            let released = slot.last.load(Ordering::Acquire) == RETIRED;
            let (ms, seq, lead) = last_and_lead(slot, ID_TICKS, now_ms);
            (
                shard as i32,
                (!released).then(|| timestamptz(layout::timestamptz_of_ms(ms, epoch))),
                (!released).then_some(seq),
                slot.minted.load(Ordering::Relaxed) as i64,
                slot.waits.load(Ordering::Relaxed) as i64,
                slot.borrowed_ms.load(Ordering::Relaxed) as i64,
                slot.clock_regressions.load(Ordering::Relaxed) as i64,
                (!released).then_some(lead),
                released,
            )
        })
        .collect();
    TableIterator::new(rows)
}

/// One row of server-level figures: the epoch and the range left, this
/// database's persisted and reserved high-water mark, and the UUIDv7 generator.
#[allow(clippy::type_complexity)]
#[pg_extern(name = "id_generator_server_status", volatile, parallel_unsafe)]
fn id_generator_server_status_0_4() -> TableIterator<
    'static,
    (
        name!(epoch, TimestampWithTimeZone),
        name!(range_end, TimestampWithTimeZone),
        name!(years_left, f64),
        name!(persisted_mark, TimestampWithTimeZone),
        name!(reserved_until, Option<TimestampWithTimeZone>),
        name!(uuid_minted, i64),
        name!(uuid_clock_regressions, i64),
        name!(uuid_lead_ms, i64),
        name!(mark_lead_ms, i64),
        name!(minting_resumes_at, Option<TimestampWithTimeZone>),
    ),
> {
    let state = shared::state().or_raise();
    let epoch = settings::configured_epoch_ms();
    let now_ms = clock::unix_us().div_euclid(1000);
    let reserved = mark::shared_reservation_ms();
    let persisted = mark::persisted_ms();
    let (_, _, uuid_lead) = last_and_lead(&state.uuid, UUID_TICKS, now_ms);
    // What every shard must stay above (Unix ms): the lowest of the
    // generators' last values (a start, crash recovery or promotion raises
    // them all alike; a shard ahead of that shows in id_generator_status),
    // and, before this database's first mint since then, what that mint will
    // raise them above. Past the lead bound minting refuses until the clock
    // is within the bound of it.
    let floor_ms = state
        .shards
        .iter()
        .map(|slot| slot.last.load(Ordering::Acquire))
        .filter(|last| *last != RETIRED)
        .map(|last| (last >> ID_TICKS.bits) as i64 + epoch)
        .min()
        .unwrap_or(0)
        .max(mark::floor_to_load_ms(reserved, persisted))
        .max(mark::held_ms());
    let mark_lead = (floor_ms - now_ms).max(0);
    let max_lead = settings::max_clock_lead_ms();
    TableIterator::once((
        timestamptz(layout::timestamptz_of_ms(0, epoch)),
        timestamptz(layout::timestamptz_of_ms(MAX_MS, epoch)),
        (MAX_MS + epoch - now_ms) as f64 / MS_PER_YEAR,
        shown(persisted),
        (reserved != 0).then(|| shown(reserved)),
        state.uuid.minted.load(Ordering::Relaxed) as i64,
        state.uuid.clock_regressions.load(Ordering::Relaxed) as i64,
        uuid_lead,
        mark_lead,
        (mark_lead > max_lead).then(|| match floor_ms > epoch + MAX_MS {
            // A mark past the last time IDs carry (persisted by a version
            // that took it): minting never resumes by itself.
            true => TimestampWithTimeZone::positive_infinity(),
            false => shown(floor_ms - max_lead),
        }),
    ))
}

/// A mark (Unix ms) as a `timestamptz`; `infinity` past its range (a mark
/// set far ahead by hand), so that the status always shows.
fn shown(unix_ms: i64) -> TimestampWithTimeZone {
    unix_ms
        .checked_mul(1000)
        .and_then(|us| us.checked_add(layout::timestamptz_of_ms(0, 0)))
        .and_then(|us| TimestampWithTimeZone::try_from(us).ok())
        .unwrap_or_else(TimestampWithTimeZone::positive_infinity)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::one;
    use pgrx::prelude::*;

    #[pg_test]
    fn status_counts_what_was_minted() {
        // 3000 IDs enter at most 3 milliseconds ahead of the clock (1024 a
        // millisecond), so neither the count of borrowed milliseconds nor the
        // lead read afterwards can be larger.
        Spi::run("SELECT next_shard_id(300) FROM generate_series(1, 3000)").unwrap();
        let row: String = one(
            "SELECT shard || ' ' || minted || ' ' || (last_ts <= clock_timestamp() + interval '10 s')
                    || ' ' || (borrowed_ms <= 3) || ' ' || (lead_ms <= 3)
               FROM id_generator_status() WHERE shard = 300",
        );
        assert_eq!(row, "300 3000 true true true");
        let last: bool = one(
            "SELECT (SELECT max(id) FROM (SELECT next_shard_id(301) AS id) s)
                  = (SELECT id_from_parts(last_ts, 301, last_seq) FROM id_generator_status() WHERE shard = 301)",
        );
        assert!(last, "the status shows the last ID minted");
    }

    #[pg_test]
    fn server_status_shows_the_mark_ahead_of_what_was_minted() {
        // Other tests of this server may have raised the mark ahead (an
        // adopt, a restore): what is checked holds whatever they did.
        Spi::run("SELECT next_shard_id(302)").unwrap();
        let row: String = one(
            "SELECT (epoch = id_epoch()) || ' ' || (range_end = '2060-11-03 19:53:47.775+00')
                    || ' ' || (years_left BETWEEN 30 AND 35)
                    || ' ' || (persisted_mark >= (SELECT last_ts FROM id_generator_status() WHERE shard = 302))
                    || ' ' || (reserved_until = persisted_mark)
                    || ' ' || (mark_lead_ms >= 0)
                    || ' ' || ((minting_resumes_at IS NULL) = (mark_lead_ms <= (SELECT setting::bigint FROM pg_settings WHERE name = 'pg_idgen.max_clock_lead_ms')))
               FROM id_generator_server_status()",
        );
        assert_eq!(row, "true true true true true true true");
    }

    #[pg_test]
    fn counters_stop_while_tracking_is_off_and_the_last_id_still_shows() {
        Spi::run("SELECT next_shard_id(303)").unwrap();
        Spi::run("SET pg_idgen.track_status = off").unwrap();
        let last: i64 = one("SELECT max(next_shard_id(303)) FROM generate_series(1, 100)");
        assert_eq!(one::<i64>("SELECT minted FROM id_generator_status() WHERE shard = 303"), 1);
        assert_eq!(one::<i64>("SELECT id_from_parts(last_ts, 303, last_seq) FROM id_generator_status() WHERE shard = 303"), last);
        assert_eq!(one::<String>("SELECT context FROM pg_settings WHERE name = 'pg_idgen.track_status'"), "superuser");
    }

    #[pg_test]
    fn released_shards_show_as_released() {
        // A shard of its own: the tests beside this one see its release at once.
        Spi::run("SELECT shard_claim(4610, 4619); SELECT next_shard_id(4615); SELECT shard_release(4615)").unwrap();
        let row: String = one(
            "SELECT released || ' ' || (last_ts IS NULL) || ' ' || (lead_ms IS NULL) || ' ' || (minted > 0)
               FROM id_generator_status() WHERE shard = 4615",
        );
        assert_eq!(row, "true true true true");
        // Only among this test's own shards: others' releases are theirs.
        assert!(!one::<bool>(
            "SELECT coalesce(bool_or(released), false) FROM id_generator_status() WHERE shard BETWEEN 4610 AND 4619 AND shard <> 4615"
        ));
    }

    #[pg_test]
    fn status_functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(proname || ':' || provolatile::text || proparallel::text, ' ' ORDER BY proname)
               FROM pg_proc WHERE proname LIKE 'id_generator%status'",
        );
        assert_eq!(rows, "id_generator_server_status:vu id_generator_status:vs");
    }
}
