//! The high-water mark travels with logical replication: on a subscriber,
//! a trigger on each replicated table raises the generator of every ID the
//! apply worker writes above that ID, and this database's persisted mark
//! with it, so that once writes move to the subscriber (a blue/green
//! cutover, a major upgrade by logical replication) it never mints an ID
//! the publisher minted for those tables, whatever its clock says.
//!
//! It acts only in a logical-replication apply worker (in replica mode): in
//! any other session it does nothing, so no role can raise the server's
//! generators by writing IDs of its own choosing. A replicated ID further
//! ahead of this server's clock than the lead bound (plus the mark's
//! reserve) is an error, which stops the apply visibly rather than freeze
//! minting until the clock catches up.

use pgrx::datum::TryFromDatumError;
use pgrx::prelude::*;

use crate::core::generator::{self, Reservation};
use crate::core::layout;
use crate::errors::{IdError, OrRaise};
use crate::mark::{DbReservation, RESERVE_MS};
use crate::{clock, settings, shared};

/// `AFTER INSERT OR UPDATE ... FOR EACH ROW EXECUTE FUNCTION
/// pg_idgen_follow_ids('col', ...)`, enabled with `ENABLE REPLICA TRIGGER`.
#[pg_trigger]
fn pg_idgen_follow_ids<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    if !matches!(trigger.when(), Ok(PgTriggerWhen::After)) || !matches!(trigger.level(), PgTriggerLevel::Row) {
        IdError::FollowMisused("must be fired AFTER INSERT OR UPDATE, FOR EACH ROW".into()).raise()
    }
    // SAFETY: reads plain globals of this backend.
    let applying = unsafe {
        pg_sys::IsLogicalWorker() && pg_sys::SessionReplicationRole == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
    };
    let Some(row) = trigger.new() else { return Ok(None) };
    let columns = trigger.extra_args()?;
    let columns = if columns.is_empty() { vec!["id".to_string()] } else { columns };
    for column in &columns {
        // Checked in every session, so that a wrong column shows when the
        // trigger is first tried, not at the cutover.
        let id: Option<i64> = match row.get_by_name(column) {
            Ok(id) => id,
            Err(TryFromDatumError::NoSuchAttributeName(_)) => IdError::FollowNoColumn(column.clone()).raise(),
            Err(_) => IdError::FollowNotBigint(column.clone()).raise(),
        };
        if let (true, Some(id)) = (applying, id) {
            follow(id);
        }
    }
    Ok(None)
}

/// Never mints `id`'s shard at or below `id` here, across restarts too
/// (values that are no pg_idgen ID, negative ones, are left alone).
fn follow(id: i64) {
    let Ok(parts) = layout::decompose(id) else { return };
    let epoch = settings::configured_epoch_ms();
    let ahead_ms = parts.ms + epoch - clock::unix_us().div_euclid(1000);
    let bound_ms = settings::max_clock_lead_ms() + RESERVE_MS;
    if ahead_ms > bound_ms {
        IdError::FollowAhead { id, ahead_ms, bound_ms }.raise()
    }
    let state = shared::state().or_raise();
    generator::raise_to(&state.shards[parts.shard as usize].last, parts.tick());
    let reservation = DbReservation::loaded(epoch);
    if !reservation.covers(parts.ms) {
        reservation.extend(parts.ms).or_raise();
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    /// Inserts `(id, t)` into table `f` through a function, for `sqlstate`.
    fn insert_state(id: i64) -> String {
        Spi::run(&format!(
            "CREATE OR REPLACE FUNCTION pg_temp.ins() RETURNS void LANGUAGE sql AS 'INSERT INTO f VALUES ({id}, ''x'')'"
        ))
        .unwrap();
        sqlstate("pg_temp.ins()")
    }

    #[pg_test]
    fn the_follow_trigger_says_how_it_is_misused_and_does_nothing_outside_the_apply_worker() {
        Spi::run("CREATE TABLE f (id bigint, t text)").unwrap();
        Spi::run("CREATE TRIGGER b BEFORE INSERT ON f FOR EACH ROW EXECUTE FUNCTION pg_idgen_follow_ids()").unwrap();
        assert_eq!(insert_state(1), "39P01");
        Spi::run("DROP TRIGGER b ON f").unwrap();
        Spi::run("CREATE TRIGGER a AFTER INSERT ON f FOR EACH ROW EXECUTE FUNCTION pg_idgen_follow_ids('nope')").unwrap();
        assert_eq!(insert_state(1), "42703");
        Spi::run("DROP TRIGGER a ON f").unwrap();
        Spi::run("CREATE TRIGGER a AFTER INSERT ON f FOR EACH ROW EXECUTE FUNCTION pg_idgen_follow_ids('t')").unwrap();
        assert_eq!(insert_state(1), "42804");
        Spi::run("DROP TRIGGER a ON f").unwrap();
        // Outside an apply worker, even in replica mode, a day-ahead ID moves nothing.
        Spi::run("CREATE TRIGGER a AFTER INSERT ON f FOR EACH ROW EXECUTE FUNCTION pg_idgen_follow_ids()").unwrap();
        Spi::run("ALTER TABLE f ENABLE ALWAYS TRIGGER a; SET session_replication_role = replica").unwrap();
        let far: i64 = one("SELECT id_from_parts(now() + interval '1 day', 4321, 0)");
        assert_eq!(insert_state(far), "ok");
        Spi::run("SET session_replication_role = origin").unwrap();
        assert!(one::<i64>("SELECT next_shard_id(4321)") < far);
    }
}
