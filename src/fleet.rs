//! The server's shard ownership, the same in every database.
//!
//! Generators live in shared memory and serve every database of a server, so
//! ownership is server-wide too. It is recorded in one database, named by
//! `pg_idgen.fleet_database` (default `postgres`), in the extension's tables
//! there (`shard_ownership`, `shard_releases`, `shard_fleet_mode`), which
//! survive restarts and crashes and replicate to standbys. Shared memory
//! holds its image:
//!
//! - after a start, a crash recovery or a promotion, one loader reads it:
//!   a background worker registered at server start
//!   (`BgWorkerStart_RecoveryFinished`), so it needs no free worker slot and
//!   only one ever runs. It connects to the fleet database, reads the tables
//!   and exits; then, restarted, it stays idle without a database, so that
//!   after a crash PostgreSQL starts it again at once. Minting in the fleet
//!   database reads the tables itself; elsewhere it waits for the loader at
//!   most 5 s, then refuses (55000) saying what the loader is doing. If the
//!   fleet database does not exist, minting refuses (55000) rather than guess;
//! - loading takes no lock that a change holds: it reads with a fresh
//!   snapshot and publishes only if no change was published since it
//!   started reading (a change publishes the whole image, which is newer);
//! - every committed change to those tables (through `shard_claim` and the
//!   others, or any other write: a trigger notices) is read back before its
//!   commit and published at commit, while the tables are still locked;
//! - a transaction that changed ownership cannot be prepared (0A000), and a
//!   release rolled back, with its transaction or to a savepoint, un-retires
//!   its generator at once.
//!
//! A backend sees its own uncommitted changes (read from the tables).

use std::ffi::{c_void, CStr};
use std::sync::atomic::Ordering;

use std::time::Duration;

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::core::generator::{self, Reservation, RETIRED};
use crate::core::layout::{self, Parts, Shard, MAX_SEQ, MAX_SHARD};
use crate::errors::{IdError, LoaderState, OrRaise};
use crate::mark::DbReservation;
use crate::shared::{self, FleetState, SHARD_WORDS};
use crate::{catalog, settings};

/// What the fleet database records, as bitmaps.
#[derive(Clone)]
struct Image {
    claims_only: bool,
    claimed: [u64; SHARD_WORDS],
    released: [u64; SHARD_WORDS],
    /// Shards adopted from another server, with the tick of the ID above which they mint.
    adopted: Vec<(usize, u64)>,
}

impl Image {
    fn every_shard() -> Image {
        Image { claims_only: false, claimed: [0; SHARD_WORDS], released: [0; SHARD_WORDS], adopted: vec![] }
    }

    fn check(&self, shard: Shard) -> Result<(), IdError> {
        let w = shard.index() / 64;
        verdict(shard, self.released[w], self.claims_only, self.claimed[w])
    }
}

/// Whether `shard` may mint, given its words of the released and claimed
/// bitmaps and the mode: the one rule for the shared image and a
/// transaction's own view.
#[inline]
fn verdict(shard: Shard, released: u64, claims_only: bool, claimed: u64) -> Result<(), IdError> {
    let bit = 1u64 << (shard.index() % 64);
    if released & bit != 0 {
        Err(IdError::ShardReleased(Some(shard.index() as i32)))
    } else if claims_only && claimed & bit == 0 {
        Err(IdError::ShardNotOwned(shard.index() as i32))
    } else {
        Ok(())
    }
}

/// Reads the ownership tables of the current database (the fleet database).
fn read_image() -> Image {
    if catalog::relation(c"shard_ownership").is_none() {
        return Image::every_shard(); // no extension here
    }
    let mut image = Image::every_shard();
    // Scans of the tables (`catalog::scan`): no lock on their indexes.
    let table = |name: &CStr| catalog::relation(name).map(|rel| (rel, move |column: &CStr| catalog::attnum(rel, column)));
    let claims: Vec<(i32, i32, Option<i64>)> = match table(c"shard_ownership") {
        Some((rel, col)) => {
            let (first, last, after) = (col(c"first_shard"), col(c"last_shard"), col(c"adopted_after"));
            catalog::scan(rel, |r| (r.int4(first).unwrap_or(0), r.int4(last).unwrap_or(-1), r.int8(after)))
        }
        None => Vec::new(),
    };
    for (first, last, after) in &claims {
        for s in (*first).max(0)..=(*last).min(MAX_SHARD) {
            image.claimed[s as usize / 64] |= 1 << (s % 64);
        }
        if let Some(parts) = after.and_then(|a| layout::decompose(a).ok()) {
            image.adopted.push((parts.shard as usize, parts.tick()));
        }
    }
    let releases: Vec<i32> = match table(c"shard_releases") {
        Some((rel, col)) => {
            let shard = col(c"shard");
            catalog::scan(rel, |r| r.int4(shard).unwrap_or(-1))
        }
        None => Vec::new(),
    };
    for s in releases.iter().copied().filter(|s| (0..=MAX_SHARD).contains(s)) {
        image.released[s as usize / 64] |= 1 << (s % 64);
    }
    // (Before ALTER EXTENSION UPDATE from 0.1.0 there is no mode table.)
    let flagged = match table(c"shard_fleet_mode") {
        Some((rel, col)) => {
            let claims_only = col(c"claims_only");
            catalog::scan(rel, |r| r.boolean(claims_only).unwrap_or(false)).into_iter().any(|b| b)
        }
        None => false,
    };
    image.claims_only = flagged || !claims.is_empty() || !releases.is_empty();
    image
}

/// Reads the tables with a snapshot taken now (after the caller's lock),
/// not the statement's or the transaction's: it sees every change committed
/// before the lock was granted, and this transaction's own.
fn read_latest() -> Image {
    catalog::with_latest_snapshot(read_image)
}

/// Publishes an image, in an order that never lets a shard mint that
/// neither the old nor the new image allows: refusals first, permissions
/// last. A load (`read_at`: the version seen before it read) publishes only
/// if nothing was published since; a change always does. Returns whether it did.
fn publish(f: &FleetState, image: &Image, read_at: Option<u64>) -> bool {
    while f.publishing.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::hint::spin_loop();
    }
    let fresh = read_at.is_none_or(|v| v == f.version.load(Ordering::Acquire));
    if fresh {
        publish_image(f, image);
        f.version.fetch_add(1, Ordering::AcqRel);
    }
    f.publishing.store(false, Ordering::Release);
    fresh
}

fn publish_image(f: &FleetState, image: &Image) {
    let Ok(state) = shared::state() else { return };
    for (shard, tick) in &image.adopted {
        // An adopted shard never mints at or below the ID it was adopted after.
        generator::raise_to(&state.shards[*shard].last, *tick);
    }
    for w in 0..SHARD_WORDS {
        f.released[w].fetch_or(image.released[w], Ordering::AcqRel);
    }
    if image.claims_only {
        f.claims_only.store(true, Ordering::Release);
    }
    for w in 0..SHARD_WORDS {
        f.claimed[w].store(image.claimed[w], Ordering::Release);
        f.released[w].store(image.released[w], Ordering::Release);
    }
    f.claims_only.store(image.claims_only, Ordering::Release);
    // Every image is the whole of what the fleet database records.
    f.loaded.store(true, Ordering::Release);
}

/// Whether the current database is the fleet database.
pub fn in_fleet_database() -> bool {
    static CACHE: BackendLocal<Option<bool>> = BackendLocal::new(None);
    if let Some(yes) = CACHE.get() {
        return yes;
    }
    let yes = catalog::database_name() == settings::fleet_database();
    CACHE.set(Some(yes));
    yes
}

/// Refuses to change ownership outside the fleet database.
pub fn require_fleet_database() {
    if !in_fleet_database() {
        IdError::NotFleetDatabase(settings::fleet_database()).raise()
    }
}

/// Whether this server mints for `shard`, in any database.
#[inline]
pub fn check(shard: Shard) -> Result<(), IdError> {
    if CHANGED.get() {
        return check_own_changes(shard);
    }
    let f = &shared::state()?.fleet;
    if !f.loaded.load(Ordering::Acquire) {
        wait_for_load(f)?;
    }
    let w = shard.index() / 64;
    verdict(
        shard,
        f.released[w].load(Ordering::Acquire),
        f.claims_only.load(Ordering::Acquire),
        f.claimed[w].load(Ordering::Acquire),
    )
}

/// How long minting waits for the loader.
const LOAD_WAIT: Duration = Duration::from_secs(5);

/// After a start, a crash recovery or a promotion: reads the ownership in
/// the fleet database, elsewhere waits (at most `LOAD_WAIT`) for the loader.
fn wait_for_load(f: &FleetState) -> Result<(), IdError> {
    // SAFETY: reads the shared recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        // A standby's image would be stale once promoted; it cannot mint anyway.
        return Err(IdError::ReadOnly("next_shard_id"));
    }
    let db = settings::fleet_database();
    let deadline = std::time::Instant::now() + LOAD_WAIT;
    if in_fleet_database() {
        if !lock_tables(|_| pause_until(deadline)) {
            return Err(IdError::OwnershipNotLoaded { database: db, loader: LoaderState::WaitingForLock });
        }
        load_here(f);
        return Ok(());
    }
    let name = std::ffi::CString::new(db.clone()).unwrap_or_default();
    // SAFETY: reads pg_database, a shared catalog, from any database.
    if unsafe { pg_sys::get_database_oid(name.as_ptr(), true) } == pg_sys::InvalidOid {
        // A missing fleet database (a typo, a rename) must not mean "every shard".
        return Err(IdError::FleetDatabaseMissing(db));
    }
    while !f.loaded.load(Ordering::Acquire) {
        if !pause_until(deadline) {
            if f.loaded.load(Ordering::Acquire) {
                break;
            }
            return Err(IdError::OwnershipNotLoaded { database: db, loader: loader_state(f) });
        }
    }
    Ok(())
}

/// Sleeps 50 ms (interruptibly); whether `deadline` is still ahead.
fn pause_until(deadline: std::time::Instant) -> bool {
    check_for_interrupts!();
    // SAFETY: sleeps this process only.
    unsafe { pg_sys::pg_usleep(50_000) };
    std::time::Instant::now() < deadline
}

/// What the loader is doing, as the error for a mint that waited for it says.
fn loader_state(f: &FleetState) -> LoaderState {
    match f.loader_state.load(Ordering::Acquire) {
        1 => LoaderState::Connecting,
        2 => LoaderState::WaitingForLock,
        3 => LoaderState::Loaded,
        _ => LoaderState::NotStarted,
    }
}

/// Reads the ownership tables of this (the fleet) database into shared
/// memory, without waiting for any change in progress (see `publish`).
fn load_here(f: &FleetState) {
    let read_at = f.version.load(Ordering::Acquire);
    publish(f, &read_latest(), Some(read_at));
}

/// Checks a shard against this transaction's view: the tables as it
/// changed them (read again after each change).
fn check_own_changes(shard: Shard) -> Result<(), IdError> {
    static CACHE: BackendLocal<Option<(u64, Image)>> = BackendLocal::new(None);
    let generation = catalog::generation();
    if !matches!(CACHE.borrow_mut().as_ref(), Some((g, _)) if *g == generation) {
        let image = read_image();
        *CACHE.borrow_mut() = Some((generation, image));
    }
    CACHE.borrow_mut().as_ref().map_or(Ok(()), |(_, image)| image.check(shard))
}

// ---- this transaction's changes -------------------------------------------------

/// The transaction changed the ownership tables of the fleet database.
static CHANGED: BackendLocal<bool> = BackendLocal::new(false);
/// Generators this transaction retired: (subtransaction, shard, state before).
static RETIRED_HERE: BackendLocal<Vec<(pg_sys::SubTransactionId, usize, u64)>> = BackendLocal::new(Vec::new());
/// The image read at pre-commit, published at commit.
static TO_PUBLISH: BackendLocal<Option<Image>> = BackendLocal::new(None);
static CALLBACKS: BackendLocal<bool> = BackendLocal::new(false);

fn register_callbacks() {
    if !CALLBACKS.get() {
        CALLBACKS.set(true);
        // SAFETY: registered once per process; the callbacks below never
        // raise at commit or abort, where PostgreSQL forbids it.
        unsafe {
            pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
            pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
        }
    }
}

/// Notes that this transaction changed ownership (from the tables' trigger)
/// and queues it behind every other change, as `shard_claim` and the others
/// do: whatever wrote the tables, changes commit and publish one at a time,
/// each reading what the previous one committed.
fn note_change() {
    if in_fleet_database() {
        register_callbacks();
        CHANGED.set(true);
        if let Some(rel) = catalog::relation(c"shard_ownership") {
            catalog::lock(rel, pg_sys::ShareUpdateExclusiveLock);
        }
    }
}

/// Retires a shard's generator, undone if the (sub)transaction rolls
/// back. Returns the state it held.
fn retire(shard: Shard) -> u64 {
    register_callbacks();
    let slot = &shared::state().or_raise().shards[shard.index()];
    let prev = slot.last.swap(RETIRED, Ordering::AcqRel);
    if prev != RETIRED {
        // SAFETY: reads the current subtransaction's ID; no preconditions.
        let subid = unsafe { pg_sys::GetCurrentSubTransactionId() };
        RETIRED_HERE.borrow_mut().push((subid, shard.index(), prev));
    }
    prev
}

/// Stops minting `shard` on this server at once, also in statements under
/// way in other backends, and returns an ID above every ID it handed out
/// for it. For `shard_release` (`for_good` false) the retirement is undone
/// if the transaction rolls back; for a Citus hand-over, whose record is
/// written outside it, it is not (until the generator is raised again, or
/// the server restarts).
pub fn retire_above_all(shard: Shard, for_good: bool) -> i64 {
    // Loaded first: once the persisted mark is loaded, the generator's state
    // is at or above every value handed out, before the last restart too.
    let reservation = DbReservation::loaded(settings::configured_epoch_ms());
    let prev = match for_good {
        true => shared::state().or_raise().shards[shard.index()].last.swap(RETIRED, Ordering::AcqRel),
        false => retire(shard),
    };
    if prev == RETIRED {
        // Retired before (a release still in progress, or an earlier one):
        // the reservation covers every value.
        let ms = reservation.reserved_until_ms() - settings::configured_epoch_ms();
        layout::compose(Parts { ms, shard: shard.index() as i32, seq: MAX_SEQ }).or_raise()
    } else {
        // One tick past the last value.
        layout::from_tick(prev + 1, shard)
    }
}

/// Never mints `shard` at or below `after` (one of its IDs) from now on,
/// across restarts too: raises its generator (reviving a retired one) and
/// the database's reservation.
pub fn raise_above(shard: Shard, after: i64) {
    let parts = layout::decompose(after).or_raise();
    let reservation = DbReservation::loaded(settings::configured_epoch_ms());
    let after_tick = parts.tick();
    let slot = &shared::state().or_raise().shards[shard.index()];
    let _ = slot.last.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
        Some(if cur == RETIRED { after_tick } else { cur.max(after_tick) })
    });
    // After a restart, the recovered mark starts every generator above `after`.
    if !reservation.covers(parts.ms) {
        reservation.extend(parts.ms).or_raise();
    }
}

fn restore(entry: &(pg_sys::SubTransactionId, usize, u64)) {
    if let Ok(state) = shared::state() {
        let _ = state.shards[entry.1].last.compare_exchange(RETIRED, entry.2, Ordering::AcqRel, Ordering::Acquire);
    }
}

fn end_of_transaction() {
    CHANGED.set(false);
    WRITING.set(false);
    RETIRED_HERE.borrow_mut().clear();
    *TO_PUBLISH.borrow_mut() = None;
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    match event {
        XACT_EVENT_PRE_COMMIT if CHANGED.get() => {
            // May raise: the transaction then aborts. The statement's snapshot
            // is gone by now; read with a fresh one that sees every change of
            // this transaction, as deferred triggers do.
            // SAFETY: the transaction is still open.
            unsafe { pg_sys::CommandCounterIncrement() };
            *TO_PUBLISH.borrow_mut() = Some(read_latest());
        }
        XACT_EVENT_PRE_PREPARE if CHANGED.get() || !RETIRED_HERE.borrow_mut().is_empty() => {
            IdError::PrepareOwnership.raise()
        }
        XACT_EVENT_COMMIT => {
            if let (Some(image), Ok(state)) = (TO_PUBLISH.borrow_mut().take(), shared::state()) {
                publish(&state.fleet, &image, None);
            }
            end_of_transaction();
        }
        XACT_EVENT_ABORT => {
            for entry in RETIRED_HERE.borrow_mut().iter().rev() {
                restore(entry);
            }
            end_of_transaction();
        }
        XACT_EVENT_PREPARE => end_of_transaction(),
        _ => {}
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    my: pg_sys::SubTransactionId,
    parent: pg_sys::SubTransactionId,
    _arg: *mut c_void,
) {
    use pg_sys::SubXactEvent::*;
    let mut retired = RETIRED_HERE.borrow_mut();
    match event {
        SUBXACT_EVENT_ABORT_SUB => {
            for entry in retired.iter().rev().filter(|e| e.0 == my) {
                restore(entry);
            }
            retired.retain(|e| e.0 != my);
        }
        SUBXACT_EVENT_COMMIT_SUB => {
            for e in retired.iter_mut().filter(|e| e.0 == my) {
                e.0 = parent;
            }
        }
        _ => {}
    }
}

/// Set while one of the ownership functions writes the ownership tables.
static WRITING: BackendLocal<bool> = BackendLocal::new(false);

/// The ownership functions' leave to write the ownership tables, for as long
/// as it lives (and at most until the transaction ends): any other write,
/// by a role that is not a superuser, is refused by their trigger, so that
/// a grant on the tables never lets a role around the functions' checks.
pub struct Writing;

impl Writing {
    pub fn begin() -> Writing {
        WRITING.set(true);
        Writing
    }
}

impl Drop for Writing {
    fn drop(&mut self) {
        WRITING.set(false);
    }
}

/// The trigger of the ownership tables: refuses a write that does not come
/// from the ownership functions (unless by a superuser: a restore); every
/// backend drops its cached copy, and in the fleet database the change is
/// published at commit.
#[pg_trigger]
fn pg_idgen_ownership_changed<'a>(
    trigger: &'a PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, AllocatedByPostgres>>, PgTriggerError> {
    // SAFETY: asks whether the current user is a superuser; no preconditions.
    if !WRITING.get() && !unsafe { pg_sys::superuser() } {
        IdError::OwnershipWrittenDirectly(trigger.table_name()?).raise()
    }
    catalog::invalidate(trigger.relation()?.oid());
    note_change();
    Ok(None)
}

// ---- the loader ------------------------------------------------------------------

/// Seconds before PostgreSQL starts the loader again after it exits: after
/// loading it exits, and is started again to wait, idle, for a crash.
const LOADER_RESTART: Duration = Duration::from_secs(10);

/// Registers the loader with the postmaster (while preloading). Not during
/// `pg_upgrade`, which must find no connection to the fleet database.
pub fn register_loader() {
    // SAFETY: a plain global flag of the server.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return;
    }
    BackgroundWorkerBuilder::new("pg_idgen loader")
        .set_type("pg_idgen loader")
        .set_library("pg_idgen")
        .set_function("pg_idgen_loader")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(LOADER_RESTART))
        .load();
}

/// The loader. PostgreSQL starts it once recovery is over: at server start,
/// after a crash recovery (shared memory is new, so nothing is loaded) and
/// when a standby is promoted. It connects to the fleet database, waits
/// (without blocking anyone) for locks on the ownership tables, loads them,
/// folds the mark files of dropped databases (see `mark`), and exits with
/// code 1, which has PostgreSQL start it again after `LOADER_RESTART`: then
/// it finds everything loaded and waits, connected to no database (so it
/// never stands in the way of DROP DATABASE or pg_upgrade), until the
/// server stops or crashes. Exit code 0 would unregister it.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_idgen_loader(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let f = &shared::state().or_raise().fleet;
    if loader_state(f) != LoaderState::Loaded {
        f.loader_state.store(LoaderState::Connecting as u32, Ordering::Release);
        let db = settings::fleet_database();
        BackgroundWorker::connect_worker_to_spi(Some(&db), None);
        let loaded = BackgroundWorker::transaction(|| {
            let mut logged = false;
            let waited = |rel| {
                if !logged {
                    f.loader_state.store(LoaderState::WaitingForLock as u32, Ordering::Release);
                    log!("pg_idgen loader: waiting for a lock on an ownership table in database \"{db}\", held by {}", holders(rel));
                    logged = true;
                }
                BackgroundWorker::wait_latch(Some(Duration::from_millis(100)))
            };
            if !lock_tables(waited) {
                return false;
            }
            load_here(f);
            crate::mark::fold_files_of_dropped_databases();
            true
        });
        if loaded {
            f.loader_state.store(LoaderState::Loaded as u32, Ordering::Release);
            log!("pg_idgen: loaded the server's shard ownership from database \"{db}\"");
            // Minting is open; now whether another primary of this data runs.
            BackgroundWorker::transaction(crate::copies::check);
        }
    } else {
        // Idle, connected to no database (so it shows in pg_stat_activity
        // and stands in no database's way), until the server stops.
        BackgroundWorker::connect_worker_to_spi(None, None);
        while BackgroundWorker::wait_latch(None) {}
    }
    // SAFETY: ends this worker process the way PostgreSQL's own do.
    unsafe { pg_sys::proc_exit(1) };
}

/// Takes share locks on the ownership tables without queueing (so that it
/// never blocks a change behind it). While one is held elsewhere, calls
/// `waited` with that table, which sleeps and says whether to go on trying.
fn lock_tables(mut waited: impl FnMut(pg_sys::Oid) -> bool) -> bool {
    for name in [c"shard_ownership", c"shard_releases", c"shard_fleet_mode"] {
        let Some(rel) = catalog::relation(name) else { continue };
        // SAFETY: a conditional lock request on an existing relation of ours.
        while !unsafe { pg_sys::ConditionalLockRelationOid(rel, pg_sys::AccessShareLock as pg_sys::LOCKMODE) } {
            if !waited(rel) {
                return false;
            }
        }
    }
    true
}

/// Who holds a lock on a relation, for the log: process IDs, or prepared transactions.
fn holders(rel: pg_sys::Oid) -> String {
    catalog::query_one::<String>(
        "SELECT pg_catalog.string_agg(DISTINCT CASE WHEN l.pid IS NULL THEN 'a prepared transaction (pg_prepared_xacts)'
                                                    ELSE 'process ' OPERATOR(pg_catalog.||) l.pid END, ', ')
           FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'relation' AND l.relation OPERATOR(pg_catalog.=) $1 AND l.granted",
        &[rel.into()],
    )
    .unwrap_or_else(|| "another transaction".into())
}
