//! Read-only catalog queries, and the names of pg_idgen's own objects.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::errors::OrRaise;

/// The first column of the first row of a read-only query; None for no row
/// or NULL. Unlike `Spi::get_one`, it never assigns a transaction ID, so it
/// also runs on a hot standby.
pub fn query_one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid<'_>]) -> Option<T> {
    Spi::connect(|c| match c.select(sql, Some(1), args).or_raise().next() {
        Some(row) => row.get::<T>(1).or_raise(),
        None => None,
    })
}

/// An object of the extension, qualified with the extension's schema and
/// quoted for use in SQL.
pub fn qualified(object: &str) -> String {
    let schema: String = query_one(
        "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pg_idgen'",
        &[],
    )
    .unwrap_or_default();
    format!("{schema}.{object}")
}

/// Bumped by every relcache invalidation (any change to the registry or
/// claims tables sends one, through their triggers) and by every change to a
/// schema; backend caches of those tables are valid while it stands still.
static GENERATION: AtomicU64 = AtomicU64::new(1);
static CALLBACKS_REGISTERED: AtomicBool = AtomicBool::new(false);

unsafe extern "C-unwind" fn invalidate_relcache(_arg: pg_sys::Datum, _relid: pg_sys::Oid) {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C-unwind" fn invalidate_syscache(_arg: pg_sys::Datum, _cacheid: i32, _hash: u32) {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// The current cache generation of this backend. Invalidations are rare, and
/// a reload costs one query, so any relcache invalidation counts.
#[inline]
pub fn generation() -> u64 {
    if !CALLBACKS_REGISTERED.load(Ordering::Relaxed) {
        CALLBACKS_REGISTERED.store(true, Ordering::Relaxed);
        // SAFETY: the callbacks only bump an atomic; registered once per
        // process, within PostgreSQL's fixed number of slots.
        unsafe {
            pg_sys::CacheRegisterRelcacheCallback(Some(invalidate_relcache), pg_sys::Datum::from(0));
            pg_sys::CacheRegisterSyscacheCallback(
                pg_sys::SysCacheIdentifier::NAMESPACEOID as i32,
                Some(invalidate_syscache),
                pg_sys::Datum::from(0),
            );
        }
    }
    GENERATION.load(Ordering::Relaxed)
}

/// Processes pending invalidation messages, so that changes other backends
/// committed are seen now.
pub fn accept_invalidations() {
    // SAFETY: what every lock acquisition does; no preconditions.
    unsafe { pg_sys::AcceptInvalidationMessages() };
}

/// Sends a relcache invalidation for the trigger's table on every change, so
/// that every backend drops its cached copy at its next transaction.
#[pg_trigger]
fn pg_idgen_table_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    let relid = trigger.relation()?.oid();
    // SAFETY: queues an invalidation message for a relation that exists.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    Ok(None)
}
