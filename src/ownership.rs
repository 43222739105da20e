//! Which logical shards this server mints for, and moving a shard between
//! servers without ever minting an ID twice.
//!
//! A server with no claims mints for every shard. Once it has claims
//! (`shard_claim`), it mints only for the shards it claims. `shard_release`
//! stops minting for a shard at once (also in statements under way in other
//! backends) and returns an ID above every ID this server handed out for it;
//! `shard_adopt` on the new owner claims the shard and never mints at or
//! below that ID, whatever its clock says, across restarts too (the ID's time
//! goes into the persisted high-water mark). Ownership is recorded in tables,
//! so it survives restarts and replicates to standbys.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

use crate::backend::BackendLocal;
use crate::core::generator::{Reservation, RETIRED};
use crate::core::layout::{self, Parts, Shard, MAX_SEQ, MAX_SHARD};
use crate::errors::{IdError, OrRaise};
use crate::mark::{self, DbReservation};
use crate::{catalog, settings, shared};

extension_sql_file!("../sql/ownership.sql", name = "ownership", requires = [catalog::pg_idgen_table_changed]);

const WORDS: usize = (MAX_SHARD as usize + 1) / 64;

/// The backend's copy of the claims: None when there are none (every shard
/// is this server's), else a bitmap of the shards claimed.
struct Owned {
    generation: u64,
    shards: Option<Box<[u64; WORDS]>>,
}

static OWNED: BackendLocal<Owned> = BackendLocal::new(Owned { generation: 0, shards: None });

fn table(name: &str) -> String {
    catalog::qualified(name)
}

fn load() -> Option<Box<[u64; WORDS]>> {
    let sql = format!("SELECT first_shard, last_shard FROM {}", table("shard_ownership"));
    let ranges: Vec<(i32, i32)> =
        catalog::query_rows(&sql, &[], |row| Ok((row.get::<i32>(1)?.unwrap_or(0), row.get::<i32>(2)?.unwrap_or(-1))));
    if ranges.is_empty() {
        return None;
    }
    let mut bits = Box::new([0u64; WORDS]);
    for (first, last) in ranges {
        for s in first.max(0)..=last.min(MAX_SHARD) {
            bits[s as usize / 64] |= 1 << (s % 64);
        }
    }
    Some(bits)
}

fn owns_cached(shard: Shard) -> bool {
    let generation = catalog::generation();
    let mut o = OWNED.borrow_mut();
    if o.generation != generation {
        *o = Owned { generation, shards: load() };
    }
    o.shards.as_ref().is_none_or(|bits| bits[shard.index() / 64] & (1 << (shard.index() % 64)) != 0)
}

/// Whether this server mints for `shard`.
#[inline]
pub fn check(shard: Shard) -> Result<(), IdError> {
    if owns_cached(shard) {
        return Ok(());
    }
    // A miss: make sure no claim committed since is left unseen.
    catalog::accept_invalidations();
    if owns_cached(shard) {
        Ok(())
    } else {
        Err(IdError::ShardNotOwned(shard.index() as i32))
    }
}

/// Changes to ownership queue behind each other; minting is not blocked.
fn lock_claims() {
    let rel = catalog::relation(c"shard_ownership").ok_or(IdError::NotInstalled).or_raise();
    catalog::lock(rel, pg_sys::ShareRowExclusiveLock);
}

/// The claimed range holding `shard`, if any.
fn claim_holding(shard: Shard) -> Option<(i32, i32)> {
    let r: Vec<i32> = catalog::query_one(
        &format!(
            "SELECT ARRAY[first_shard, last_shard] FROM {} WHERE $1 BETWEEN first_shard AND last_shard",
            table("shard_ownership")
        ),
        &[(shard.index() as i32).into()],
    )?;
    Some((r[0], r[1]))
}

/// Claims shards `first_shard` to `last_shard` for this server.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_claim(first_shard: i32, last_shard: i32) {
    let (first, last) = (Shard::new(first_shard).or_raise(), Shard::new(last_shard).or_raise());
    if first.index() > last.index() {
        IdError::ShardRangeInvalid { first: first_shard, last: last_shard }.raise()
    }
    lock_claims();
    let overlap: Option<Vec<i32>> = catalog::query_one(
        &format!(
            "SELECT ARRAY[first_shard, last_shard] FROM {} WHERE first_shard <= $2 AND last_shard >= $1 ORDER BY 1 LIMIT 1",
            table("shard_ownership")
        ),
        &[first_shard.into(), last_shard.into()],
    );
    if let Some(h) = overlap {
        IdError::ShardsOverlap { first: first_shard, last: last_shard, held_first: h[0], held_last: h[1] }.raise()
    }
    let released: Option<i32> = catalog::query_one(
        &format!("SELECT min(shard) FROM {} WHERE shard BETWEEN $1 AND $2", table("shard_releases")),
        &[first_shard.into(), last_shard.into()],
    );
    if let Some(s) = released {
        IdError::ShardWasReleased(s).raise()
    }
    catalog::run(
        &format!("INSERT INTO {} (first_shard, last_shard) VALUES ($1, $2)", table("shard_ownership")),
        &[first_shard.into(), last_shard.into()],
    );
}

/// Stops minting for a shard on this server and returns an ID just above
/// every ID it handed out for it: the `after` for `shard_adopt` on its new
/// owner.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_release(shard: i32) -> i64 {
    let shard = Shard::new(shard).or_raise();
    mark::check_writable("shard_release");
    let state = shared::state().or_raise();
    lock_claims();
    let Some((first, last)) = claim_holding(shard) else {
        IdError::ShardNotOwned(shard.index() as i32).raise()
    };
    let s = shard.index() as i32;
    let t = table("shard_ownership");
    catalog::run(&format!("DELETE FROM {t} WHERE first_shard = $1 AND last_shard = $2"), &[first.into(), last.into()]);
    catalog::run(
        &format!(
            "INSERT INTO {t} (first_shard, last_shard)
             SELECT f, l FROM (VALUES ($1, $3 - 1), ($3 + 1, $2)) v(f, l) WHERE f <= l"
        ),
        &[first.into(), last.into(), s.into()],
    );

    // Once the persisted mark is loaded, the generator's state is at or above
    // every value handed out, before the last restart too. Retiring it stops
    // minting at once, also in statements under way in other backends; the
    // state it held is the last value handed out.
    let reservation = DbReservation::current(settings::configured_epoch_ms());
    reservation.ensure_loaded();
    let slot = &state.shards[shard.index()];
    let prev = slot.last.swap(RETIRED, Ordering::AcqRel);
    let high_water = if prev == RETIRED {
        // Retired by a release still in progress: fall back to the reservation, which covers every value.
        let ms = reservation.reserved_until_ms() - settings::configured_epoch_ms();
        layout::compose(Parts { ms, shard: s, seq: MAX_SEQ }).or_raise()
    } else {
        register_xact_callback(PgXactCallbackEvent::Abort, move || {
            let _ = slot.last.compare_exchange(RETIRED, prev, Ordering::AcqRel, Ordering::Acquire);
        });
        // One tick past the last value: above every ID handed out.
        layout::from_tick(prev + 1, shard)
    };
    catalog::run(
        &format!(
            "INSERT INTO {} (shard, high_water) VALUES ($1, $2)
             ON CONFLICT (shard) DO UPDATE SET high_water = excluded.high_water, released_at = now()",
            table("shard_releases")
        ),
        &[s.into(), high_water.into()],
    );
    high_water
}

/// Claims a shard released by another server, and never mints at or below
/// `after` (the ID `shard_release` returned there) for it.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_adopt(shard: i32, after: i64) {
    let shard = Shard::new(shard).or_raise();
    let parts = layout::decompose(after).or_raise();
    if parts.shard != shard.index() as i32 {
        IdError::ForeignId { id: after, id_shard: parts.shard, shard: shard.index() as i32 }.raise()
    }
    mark::check_writable("shard_adopt");
    let state = shared::state().or_raise();
    lock_claims();
    if claim_holding(shard).is_some() {
        IdError::AlreadyOwned(parts.shard).raise()
    }
    catalog::run(
        &format!("INSERT INTO {} (first_shard, last_shard, adopted_after) VALUES ($1, $1, $2)", table("shard_ownership")),
        &[parts.shard.into(), after.into()],
    );
    catalog::run(&format!("DELETE FROM {} WHERE shard = $1", table("shard_releases")), &[parts.shard.into()]);

    let reservation = DbReservation::current(settings::configured_epoch_ms());
    reservation.ensure_loaded();
    let after_tick = ((parts.ms as u64) << layout::SEQ_BITS) | parts.seq as u64;
    let slot = &state.shards[shard.index()];
    let _ = slot.last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        Some(if cur == RETIRED { after_tick } else { cur.max(after_tick) })
    });
    // After a restart, the recovered mark starts every generator above `after`.
    if !reservation.covers(parts.ms) {
        reservation.extend(parts.ms).or_raise();
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn without_claims_every_shard_mints_with_claims_only_claimed_ones() {
        assert_eq!(sqlstate("next_shard_id(4000)"), "ok");
        Spi::run("SELECT shard_claim(0, 99)").unwrap();
        assert_eq!(sqlstate("next_shard_id(99)"), "ok");
        assert_eq!(sqlstate("next_shard_id(100)"), "55000");
        assert_eq!(sqlstate("next_shard_id(4000)"), "55000");
        Spi::run("SELECT shard_claim(100, 100)").unwrap();
        assert_eq!(sqlstate("next_shard_id(100)"), "ok");
        assert_eq!(one::<String>("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims"), "0-99,100-100");
    }

    #[pg_test(error = "shard 200 is not claimed on this server")]
    fn an_unclaimed_shard_says_so() {
        Spi::run("SELECT shard_claim(0, 99); SELECT next_shard_id(200)").unwrap();
    }

    #[pg_test]
    fn claim_errors_have_their_sqlstates() {
        Spi::run("SELECT shard_claim(10, 20)").unwrap();
        assert_eq!(sqlstate("shard_claim(20, 30)"), "23505");
        assert_eq!(sqlstate("shard_claim(0, 10)"), "23505");
        assert_eq!(sqlstate("shard_claim(5, 4)"), "22023");
        assert_eq!(sqlstate("shard_claim(0, 8192)"), "22003");
        assert_eq!(sqlstate("shard_claim(-1, 3)"), "22003");
        assert_eq!(sqlstate("shard_release(30)"), "55000");
        assert_eq!(sqlstate("shard_adopt(15, id_from_parts(now(), 15, 0))"), "55000", "already claimed");
        assert_eq!(sqlstate("shard_adopt(40, id_from_parts(now(), 41, 0))"), "22023", "an ID of another shard");
        assert_eq!(sqlstate("shard_adopt(40, -1)"), "22003");
    }

    #[pg_test]
    fn release_stops_minting_and_returns_an_id_above_all_minted() {
        Spi::run("SELECT shard_claim(0, 9)").unwrap();
        let last: i64 = one("SELECT max(next_shard_id(5)) FROM generate_series(1, 5000)");
        let high: i64 = one("SELECT shard_release(5)");
        assert!(high > last, "{high} is above the last ID handed out, {last}");
        assert_eq!(one::<i32>(&format!("SELECT id_shard({high})")), 5);
        assert_eq!(sqlstate("next_shard_id(5)"), "55000");
        assert_eq!(one::<String>("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims"), "0-4,6-9");
        assert_eq!(one::<i64>("SELECT high_water FROM shard_releases WHERE shard = 5"), high);
        assert_eq!(sqlstate("shard_claim(5, 5)"), "55000", "a released shard is adopted, not claimed");
        // Taking it back above the release ID.
        Spi::run(&format!("SELECT shard_adopt(5, {high})")).unwrap();
        assert!(one::<i64>("SELECT next_shard_id(5)") > high);
        assert_eq!(one::<i64>("SELECT adopted_after FROM shard_claims WHERE first_shard = 5"), high);
    }

    #[pg_test]
    fn adopting_far_ahead_raises_the_persisted_mark() {
        Spi::run("SET pg_idgen.max_clock_lead_ms = '1h'").unwrap();
        let after: i64 = one("SELECT id_from_parts(clock_timestamp() + interval '20 minutes', 77, 3)");
        Spi::run(&format!("SELECT shard_adopt(77, {after})")).unwrap();
        assert_eq!(one::<i64>("SELECT next_shard_id(77)"), after + 1);
        assert!(one::<bool>(&format!("SELECT persisted_mark >= id_ts({after}) FROM id_generator_server_status()")));
    }

    #[pg_test]
    fn registering_a_schema_needs_a_claim_once_there_are_claims() {
        Spi::run("SELECT shard_claim(0, 9)").unwrap();
        assert_eq!(sqlstate("shard_schema_create('far', 500)"), "55000");
        assert_eq!(sqlstate("shard_schema_create('near', 5)"), "ok");
    }

    #[pg_test]
    fn ownership_functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(proname || ':' || provolatile::text || proparallel::text || proisstrict::text, ' ' ORDER BY proname)
               FROM pg_proc WHERE proname IN ('shard_claim', 'shard_release', 'shard_adopt')",
        );
        assert_eq!(rows, "shard_adopt:vutrue shard_claim:vutrue shard_release:vutrue");
    }
}
