//! Which logical shards this server mints for, and moving a shard between
//! servers without ever minting an ID twice: the SQL functions. The state
//! they change is server-wide (see `fleet`): they run in the fleet database
//! (`pg_idgen.fleet_database`), and every database of the server follows.
//!
//! A server that never had a claim mints for every shard. Once it has
//! claimed (`shard_claim`) or released a shard, it mints only for the shards
//! it claims, until `shard_own_all()` says otherwise. `shard_release` stops
//! minting for a shard at once (also in statements under way in other
//! backends and databases) and returns an ID above every ID this server
//! handed out for it; `shard_adopt` on the new owner claims the shard and
//! never mints at or below that ID, across restarts too.

use pgrx::prelude::*;

use crate::core::layout::{self, Shard};
use crate::errors::{IdError, OrRaise};
use crate::mark;
use crate::{catalog, clock, fleet, settings};

extension_sql_file!("../sql/ownership.sql", name = "ownership", requires = [fleet::pg_idgen_ownership_changed]);

fn table(name: &str) -> String {
    catalog::qualified(name)
}

/// Records whether the server mints only what it claims, from now on.
fn set_claims_only(claims_only: bool) {
    if catalog::relation(c"shard_fleet_mode").is_none() {
        return; // the 0.1.0 schema, before ALTER EXTENSION UPDATE
    }
    catalog::run(
        &format!(
            "INSERT INTO {} (claims_only) VALUES ($1) ON CONFLICT (singleton) DO UPDATE SET claims_only = excluded.claims_only",
            table("shard_fleet_mode")
        ),
        &[claims_only.into()],
    );
}

/// Changes to ownership queue behind each other; minting is not blocked.
/// Only in the fleet database, and only for a role with the right `acl`
/// (such as `ACL_INSERT`) on `shard_ownership`. The ownership tables may be
/// written while the returned guard lives (see `fleet::Writing`).
#[must_use]
fn lock_claims(acl: u32) -> fleet::Writing {
    fleet::require_fleet_database();
    catalog::lock_to_change(c"shard_ownership", acl);
    // A trigger of another role on these tables (a role granted ALL has the
    // TRIGGER privilege) would run while the functions may write them. Ours
    // are told apart by their function, a member of the extension (of any
    // release's catalog), not by their names, which another table's trigger
    // may take.
    let foreign: Option<String> = catalog::query_one(
        "SELECT t.tgname::text || ' on ' || c.relname::text FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid
          WHERE c.relnamespace = $1 AND c.relname IN ('shard_ownership', 'shard_releases', 'shard_fleet_mode') AND NOT t.tgisinternal
            AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
                             WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid = t.tgfoid
                               AND d.refclassid = 'pg_catalog.pg_extension'::pg_catalog.regclass AND d.deptype = 'e'
                               AND e.extname = 'pg_idgen')
          ORDER BY 1 LIMIT 1",
        &[catalog::extension_schema().ok_or(IdError::NotInstalled).or_raise().into()],
    );
    if let Some(trigger) = foreign {
        IdError::ForeignTrigger(trigger).raise()
    }
    fleet::Writing::begin()
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

/// With a lease store, the store decides which shards this server mints
/// (see `lease`): the claims functions refuse, so that there is one source.
fn not_with_leases(function: &'static str) {
    if crate::settings::lease_store().is_some() {
        IdError::OwnershipFromLeases(function).raise()
    }
}

/// Claims shards `first_shard` to `last_shard` for this server.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_claim(first_shard: i32, last_shard: i32) {
    not_with_leases("shard_claim");
    let (first, last) = (Shard::new(first_shard).or_raise(), Shard::new(last_shard).or_raise());
    if first.index() > last.index() {
        IdError::ShardRangeInvalid { first: first_shard, last: last_shard }.raise()
    }
    let _writing = lock_claims(pg_sys::ACL_INSERT);
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
    set_claims_only(true);
}

/// Stops minting for a shard on this server and returns an ID just above
/// every ID it handed out for it: the `after` for `shard_adopt` on its new
/// owner.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_release(shard: i32) -> i64 {
    not_with_leases("shard_release");
    let shard = Shard::new(shard).or_raise();
    mark::check_writable("shard_release");
    let _writing = lock_claims(pg_sys::ACL_DELETE);
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

    let high_water = fleet::retire_above_all(shard, false);
    catalog::run(
        &format!(
            "INSERT INTO {} (shard, high_water) VALUES ($1, $2)
             ON CONFLICT (shard) DO UPDATE SET high_water = excluded.high_water, released_at = now()",
            table("shard_releases")
        ),
        &[s.into(), high_water.into()],
    );
    set_claims_only(true);
    high_water
}

/// Claims a shard released by another server, and never mints at or below
/// `after` (the ID `shard_release` returned there) for it.
#[pg_extern(volatile, parallel_unsafe, strict)]
fn shard_adopt(shard: i32, after: i64) {
    not_with_leases("shard_adopt");
    let shard = Shard::new(shard).or_raise();
    let parts = layout::decompose(after).or_raise();
    if parts.shard != shard.index() as i32 {
        IdError::ForeignId { id: after, id_shard: parts.shard, shard: shard.index() as i32 }.raise()
    }
    mark::check_writable("shard_adopt");
    crate::shared::state().or_raise();
    // An `after` beyond the lead bound would stop the shard (after a restart,
    // every generator) until the clock caught up: refuse it.
    let epoch = settings::configured_epoch_ms();
    let ahead_ms = parts.ms + epoch - clock::unix_us().div_euclid(1000);
    if ahead_ms > settings::max_clock_lead_ms() {
        IdError::AdoptAhead { id: after, ahead_ms, max_lead_ms: settings::max_clock_lead_ms() }.raise()
    }
    let _writing = lock_claims(pg_sys::ACL_INSERT);
    if claim_holding(shard).is_some() {
        IdError::AlreadyOwned(parts.shard).raise()
    }
    // Taking back a shard this server released: never below its own release.
    let released_at: Option<i64> = catalog::query_one(
        &format!("SELECT high_water FROM {} WHERE shard = $1", table("shard_releases")),
        &[parts.shard.into()],
    );
    if let Some(high_water) = released_at.filter(|h| after < *h) {
        IdError::AdoptBelowRelease { shard: parts.shard, after, high_water }.raise()
    }
    catalog::run(
        &format!("INSERT INTO {} (first_shard, last_shard, adopted_after) VALUES ($1, $1, $2)", table("shard_ownership")),
        &[parts.shard.into(), after.into()],
    );
    catalog::run(&format!("DELETE FROM {} WHERE shard = $1", table("shard_releases")), &[parts.shard.into()]);
    set_claims_only(true);

    fleet::raise_above(shard, after);
}

/// Makes the server mint for every shard again, as before its first claim.
/// Refused while shards it released have not been adopted back.
#[pg_extern(volatile, parallel_unsafe)]
fn shard_own_all() {
    not_with_leases("shard_own_all");
    mark::check_writable("shard_own_all");
    let _writing = lock_claims(pg_sys::ACL_DELETE);
    let released: Option<i32> = catalog::query_one(&format!("SELECT min(shard) FROM {}", table("shard_releases")), &[]);
    if let Some(s) = released {
        IdError::ShardWasReleased(s).raise()
    }
    catalog::run(&format!("DELETE FROM {}", table("shard_ownership")), &[]);
    set_claims_only(false);
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
        // A shard of its own: retiring a generator is seen at once by the
        // tests running beside this one, on the same server.
        Spi::run("SELECT shard_claim(4600, 4609)").unwrap();
        let last: i64 = one("SELECT max(next_shard_id(4605)) FROM generate_series(1, 5000)");
        let high: i64 = one("SELECT shard_release(4605)");
        assert!(high > last, "{high} is above the last ID handed out, {last}");
        assert_eq!(one::<i32>(&format!("SELECT id_shard({high})")), 4605);
        assert_eq!(sqlstate("next_shard_id(4605)"), "55000");
        assert_eq!(one::<String>("SELECT string_agg(first_shard || '-' || last_shard, ',') FROM shard_claims"), "4600-4604,4606-4609");
        assert_eq!(one::<i64>("SELECT high_water FROM shard_releases WHERE shard = 4605"), high);
        assert_eq!(sqlstate("shard_claim(4605, 4605)"), "55000", "a released shard is adopted, not claimed");
        // Taking it back above the release ID.
        Spi::run(&format!("SELECT shard_adopt(4605, {high})")).unwrap();
        assert!(one::<i64>("SELECT next_shard_id(4605)") > high);
        assert_eq!(one::<i64>("SELECT adopted_after FROM shard_claims WHERE first_shard = 4605"), high);
    }

    #[pg_test]
    fn adopting_ahead_raises_the_persisted_mark() {
        // Within the lead bound (10 s), far past the mark's reservation (1 s).
        let after: i64 = one("SELECT id_from_parts(clock_timestamp() + interval '6 s', 77, 3)");
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
