//! Shard leases from a lease store (etcd): with `pg_idgen.lease_store`
//! set, a server mints a shard only while it holds an unexpired lease on
//! it, so that no two running servers (a clone, a promoted standby, a
//! subscriber taking over writes) ever mint the same shard.
//!
//! - Each start of the postmaster makes a new identity (128 random bits):
//!   a copy of the data directory started elsewhere is another server.
//! - One background worker, the keeper (`keeper`), is granted one lease,
//!   attaches the shard keys it wins to it, renews it, files each shard's
//!   mark in the store and publishes to shared memory, per shard, the mark
//!   and the monotonic time until which it may mint (see `core::lease`).
//! - Minting reads both: a coarse monotonic clock (read from memory) and
//!   two loads per ID, nothing over the network. Without a store
//!   configured, one load of a constant.

pub mod etcd;
mod keeper;

use std::sync::atomic::Ordering;
use std::sync::OnceLock;

use pgrx::prelude::*;

use crate::clock::{self, timestamptz};
use crate::core::error::CoreError;
use crate::core::generator::Reservation;
use crate::core::layout::{self, Shard, MAX_SHARD};
use crate::errors::{IdError, LeaseWhy, OrRaise};
use crate::shared::{self, LeaseState};
use crate::settings;

pub use keeper::register;

/// Whether a shard may mint under its lease now: `None` without a lease
/// store, else the mark (Unix ms) its IDs must not pass.
#[inline]
pub fn check(leases: &LeaseState, shard: Shard) -> Result<Option<i64>, IdError> {
    if !leases.enabled {
        return Ok(None);
    }
    let i = shard.index();
    let until = leases.valid_until_ns[i].load(Ordering::Acquire);
    if until == 0 || clock::coarse_ns() >= until {
        return Err(not_held(leases, shard.index() as i32));
    }
    Ok(Some(leases.cap_ms[i].load(Ordering::Acquire)))
}

#[cold]
fn not_held(leases: &LeaseState, shard: i32) -> IdError {
    IdError::LeaseNotHeld { shard, why: why_of(leases, shard as usize), store: settings::lease_store().unwrap_or_default() }
}

/// Why shard `i` holds no lease, as the keeper last stored it.
fn why_of(leases: &LeaseState, i: usize) -> LeaseWhy {
    use LeaseWhy::*;
    let v = leases.why[i].load(Ordering::Acquire);
    [NotAsked, Asking, Held, HeldElsewhere, Unreachable, Lost, Released, Refused, NotLeader].into_iter().find(|w| *w as u32 == v).unwrap_or(NotAsked)
}

/// A reservation that also stops at the lease's mark (in the generator's
/// milliseconds): no ID minted under a lease passes the mark filed in the store.
pub struct Capped<'a, R: Reservation> {
    pub inner: &'a R,
    pub cap_ms: i64,
    /// Set when the inner reservation was extended: the mint took the slow
    /// path (a WAL flush, a lock), and the lease is checked again after it.
    pub extended: std::cell::Cell<bool>,
}

impl<'a, R: Reservation> Capped<'a, R> {
    pub fn new(inner: &'a R, cap_ms: i64) -> Self {
        Capped { inner, cap_ms, extended: std::cell::Cell::new(false) }
    }
}

impl<R: Reservation> Reservation for Capped<'_, R> {
    #[inline]
    fn covers(&self, ms: i64) -> bool {
        ms <= self.cap_ms && self.inner.covers(ms)
    }

    fn extend(&self, ms: i64) -> Result<(), CoreError> {
        if ms > self.cap_ms {
            return Err(CoreError::PastLeaseMark(None));
        }
        self.extended.set(true);
        self.inner.extend(ms)
    }
}

/// This start of the postmaster's identity: 32 hexadecimal digits, made
/// while preloading (every process of this start inherits it; a crash
/// restart keeps it; another start, on a copy of the data too, makes a new one).
pub fn identity() -> &'static str {
    IDENTITY.get().map_or("", String::as_str)
}

static IDENTITY: OnceLock<String> = OnceLock::new();

/// Makes the identity (called from `_PG_init` while preloading).
pub fn init() {
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if let Err(e) = read {
        IdError::Internal(format!("could not read /dev/urandom: {e}")).raise()
    }
    let _ = IDENTITY.set(bytes.iter().map(|b| format!("{b:02x}")).collect());
}

/// The shards this server asks the lease store for or holds, and for each
/// its state, how long it may still mint, and the mark its IDs stay under.
#[allow(clippy::type_complexity)]
#[pg_extern(volatile, parallel_safe)]
fn shard_leases() -> TableIterator<
    'static,
    (
        name!(shard, i32),
        name!(state, String),
        name!(valid_for_ms, Option<i64>),
        name!(mark, Option<TimestampWithTimeZone>),
    ),
> {
    let state = shared::state().or_raise();
    let leases = &state.leases;
    if !leases.enabled {
        return TableIterator::new(Vec::new());
    }
    let now = clock::coarse_ns();
    let rows: Vec<_> = (0..=MAX_SHARD as usize)
        .filter_map(|i| {
            let why = why_of(leases, i);
            let until = leases.valid_until_ns[i].load(Ordering::Acquire);
            let cap = leases.cap_ms[i].load(Ordering::Acquire);
            if why == LeaseWhy::NotAsked && until == 0 {
                return None;
            }
            let valid = (until > now).then(|| ((until - now) / 1_000_000) as i64);
            let shown = if why == LeaseWhy::Held && valid.is_none() { "expired" } else { why.name() };
            let mark = (cap > 0).then(|| timestamptz(layout::timestamptz_of_ms(cap, 0)));
            Some((i as i32, shown.to_string(), valid, mark))
        })
        .collect();
    TableIterator::new(rows)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::one;
    use pgrx::prelude::*;

    #[pg_test]
    fn without_a_lease_store_every_shard_mints_and_none_is_leased() {
        assert_eq!(one::<i64>("SELECT count(*) FROM shard_leases()"), 0);
        assert_eq!(one::<i32>("SELECT id_shard(next_shard_id(4711))"), 4711);
        assert_eq!(one::<String>("SELECT context FROM pg_settings WHERE name = 'pg_idgen.lease_store'"), "postmaster");
        assert_eq!(
            one::<String>("SELECT setting || unit || ' ' || context FROM pg_settings WHERE name = 'pg_idgen.lease_ttl'"),
            "10s postmaster"
        );
        assert_eq!(one::<String>("SELECT provolatile::text || proparallel::text FROM pg_catalog.pg_proc WHERE proname = 'shard_leases'"), "vs");
    }
}
