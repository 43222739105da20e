//! The high-water mark travels with logical replication: on a subscriber,
//! a trigger on each replicated table raises the generator of every ID the
//! apply worker writes above that ID, and this database's persisted mark
//! with it, so that once writes move to the subscriber (a blue/green
//! cutover, a major upgrade by logical replication) it never mints an ID
//! the publisher minted for those tables, whatever its clock says.
//!
//! It acts only in the apply worker's replica mode (`session_replication_role
//! = replica`, which only a superuser or the subscription's owner sets): in
//! any other session it does nothing, so no role can raise another's
//! generators by writing IDs of its own choosing.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::core::generator::RETIRED;
use crate::core::generator::Reservation;
use crate::core::layout::{self, SEQ_BITS};
use crate::errors::OrRaise;
use crate::mark::DbReservation;
use crate::{settings, shared};

/// `AFTER INSERT OR UPDATE ... FOR EACH ROW EXECUTE FUNCTION
/// pg_idgen_follow_ids('col', ...)`, enabled with `ENABLE REPLICA TRIGGER`.
#[pg_trigger]
fn pg_idgen_follow_ids<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    // SAFETY: reads a plain global of this backend.
    if unsafe { pg_sys::SessionReplicationRole } != pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32 {
        return Ok(None);
    }
    let Some(row) = trigger.new() else { return Ok(None) };
    let columns = trigger.extra_args()?;
    let columns = if columns.is_empty() { vec!["id".to_string()] } else { columns };
    for column in &columns {
        let id: Option<i64> = row
            .get_by_name(column)
            .map_err(|e| crate::errors::IdError::Internal(format!("column \"{column}\": {e}")))
            .or_raise();
        if let Some(id) = id {
            follow(id);
        }
    }
    Ok(None)
}

/// Never mints `id`'s shard at or below `id` here, across restarts too
/// (values that are no pg_idgen ID, negative ones, are left alone).
fn follow(id: i64) {
    let Ok(parts) = layout::decompose(id) else { return };
    let state = shared::state().or_raise();
    let tick = ((parts.ms as u64) << SEQ_BITS) | parts.seq as u64;
    let slot = &state.shards[parts.shard as usize];
    // A shard this server released stays released.
    let _ = slot.last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| (cur != RETIRED && cur < tick).then_some(tick));
    let reservation = DbReservation::loaded(settings::configured_epoch_ms());
    if !reservation.covers(parts.ms) {
        reservation.extend(parts.ms).or_raise();
    }
}
