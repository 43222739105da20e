//! The persisted time high-water mark, kept the way PostgreSQL keeps a
//! sequence: logged ahead, so that nothing handed out is ever handed out
//! again after a restart, a crash or a promotion.
//!
//! Each database with the extension has a sequence, `pg_idgen_hwm`, whose
//! value is a Unix millisecond M: no ID or UUID minted in that database
//! carries a later millisecond. Values are handed out from shared memory
//! while they fall within the reservation; the first value past it extends
//! the reservation by [`RESERVE_MS`] with `setval` (one WAL record, replayed
//! by standbys) and flushes the WAL before handing anything out under it.
//! After a server start, the first extension in each database loads M and
//! raises every generator above it, whatever the clock says. The sequence is
//! found and written only through `catalog`.

use std::sync::atomic::Ordering;

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::core::error::CoreError;
use crate::core::generator::{self, Reservation};
use crate::core::layout::{ID_TICKS, MAX_MS};
use crate::core::uuid_layout::UUID_TICKS;
use crate::errors::{IdError, OrRaise};
use crate::shared::{self, DbMark};
use crate::{catalog, clock, datafiles, settings};

/// How far ahead of the values handed out each extension reserves. After a
/// crash, minting starts up to this far ahead of the clock.
pub const RESERVE_MS: i64 = 1000;

extension_sql!(
    r#"
CREATE SEQUENCE pg_idgen_hwm AS bigint MINVALUE 0 START 0;
COMMENT ON SEQUENCE pg_idgen_hwm IS
    'pg_idgen: the Unix millisecond up to which IDs and UUIDs may have been handed out (do not change)';
SELECT pg_catalog.pg_extension_config_dump('pg_idgen_hwm', '');
"#,
    name = "hwm_sequence"
);

static MY_MARK: BackendLocal<Option<&'static DbMark>> = BackendLocal::new(None);

/// The mark's sequence in this database, found by catalog lookup in the
/// extension's schema (never through `search_path`).
fn sequence() -> pg_sys::Oid {
    catalog::relation(c"pg_idgen_hwm").ok_or(IdError::NotInstalled).or_raise()
}

/// The reservation of the current database, for a generator whose
/// milliseconds are `offset_ms` behind Unix milliseconds.
pub struct DbReservation {
    mark: &'static DbMark,
    offset_ms: i64,
}

impl DbReservation {
    /// The current database's reservation, its persisted mark loaded (every
    /// generator raised above it) if not yet done since the server started:
    /// before anything is measured against the generators, so that a
    /// refusal states the whole distance to what they must stay above.
    pub fn loaded(offset_ms: i64) -> DbReservation {
        check_held();
        let reservation = DbReservation::current(offset_ms);
        if reservation.reserved_until_ms() == 0 {
            extend(reservation.mark, clock::unix_us().div_euclid(1000));
        }
        reservation
    }

    fn current(offset_ms: i64) -> DbReservation {
        let mark = match MY_MARK.get() {
            Some(mark) => mark,
            None => {
                shared::state().or_raise();
                let mark = entry_for(my_database());
                MY_MARK.set(Some(mark));
                mark
            }
        };
        DbReservation { mark, offset_ms }
    }

    pub fn reserved_until_ms(&self) -> i64 {
        self.mark.reserved_ms.load(Ordering::Acquire)
    }

}

impl Reservation for DbReservation {
    #[inline]
    fn covers(&self, ms: i64) -> bool {
        ms + self.offset_ms <= self.mark.reserved_ms.load(Ordering::Acquire)
    }

    fn extend(&self, ms: i64) -> Result<(), CoreError> {
        extend(self.mark, ms + self.offset_ms);
        Ok(())
    }
}

fn my_database() -> u32 {
    // SAFETY: MyDatabaseId is set once a backend has connected.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}

/// The entry that holds a database's reservation: its shared entry, a free
/// one, or one of a dropped database. When all `pg_idgen.max_databases` are
/// taken by databases that exist, the session keeps a reservation of its
/// own (in its own memory), read from and extended in the same sequence and
/// file under the same lock (see `write_mark`): just as safe, at the cost of
/// at most a WAL flush per session and second of minting. Nothing another
/// database does can stop this one from minting.
fn entry_for(dboid: u32) -> &'static DbMark {
    if let Some(mark) = shared::mark_of(dboid) {
        return mark;
    }
    if let Some(mark) = shared::reclaim_mark(dboid, database_exists) {
        return mark;
    }
    if !shared::state().or_raise().fallback_logged.swap(true, Ordering::Relaxed) {
        pgrx::log!(
            "pg_idgen: more than pg_idgen.max_databases = {} databases mint on this server; sessions of the others (database OID {dboid} first) each keep their own reservation",
            crate::settings::max_databases()
        );
    }
    Box::leak(Box::new(DbMark { per_session: true, ..DbMark::new(dboid) }))
}

/// This database's reservation in shared memory (Unix ms), without taking
/// an entry: 0 when there is none (nothing minted here since the start).
pub fn shared_reservation_ms() -> i64 {
    MY_MARK
        .get()
        .or_else(|| shared::find_mark(my_database()))
        .map_or(0, |m| m.reserved_ms.load(Ordering::Acquire))
}

/// What the first mint in the current database since the server started
/// (or was promoted) will raise the generators above, in Unix ms, given its
/// reservation in shared memory and its persisted mark: that mark and the
/// last transaction replayed. 0 once the mark is loaded (a reservation is held).
pub fn floor_to_load_ms(reserved_ms: i64, persisted_ms: i64) -> i64 {
    if reserved_ms != 0 {
        return 0;
    }
    persisted_ms.max(last_replayed_commit_ms())
}

/// Whether a database exists (a dropped one's mark entry can be reused).
fn database_exists(dboid: u32) -> bool {
    // SAFETY: a syscache existence probe; no locks kept.
    unsafe {
        pg_sys::SearchSysCacheExists(
            pg_sys::SysCacheIdentifier::DATABASEOID as i32,
            pg_sys::Datum::from(dboid),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
            pg_sys::Datum::from(0),
        )
    }
}

/// The persisted mark of the current database (Unix ms), read as the superuser.
pub fn persisted_ms() -> i64 {
    let seq = sequence();
    catalog::as_superuser(|| catalog::sequence_value(seq))
}

/// Extends the current database's reservation to cover Unix millisecond `need_ms`.
fn extend(mark: &DbMark, need_ms: i64) {
    let seq = sequence();
    // One extension at a time per database; interruptible and seen by the
    // deadlock detector, and released as soon as the mark is written.
    catalog::lock(seq, pg_sys::ShareUpdateExclusiveLock);
    if mark.reserved_ms.load(Ordering::Acquire) < need_ms {
        catalog::as_superuser(|| write_mark(mark, seq, need_ms));
    }
    catalog::unlock(seq, pg_sys::ShareUpdateExclusiveLock);
}

fn write_mark(mark: &DbMark, seq: pg_sys::Oid, need_ms: i64) {
    let mut persisted = catalog::sequence_value(seq);
    let reserved = mark.reserved_ms.load(Ordering::Acquire);
    let dboid = mark.dboid.load(Ordering::Relaxed);
    if persisted > last_mark_ms() {
        // Past the last time IDs carry, it protects no ID: set by hand (a
        // setval rolled back, which setval does not undo), never by minting.
        // Set back to what this server reserved, never held.
        let ours = reserved.max(filed_ms(dboid));
        pgrx::warning!(
            "pg_idgen: the high-water mark of database \"{}\" ({persisted} ms after 1970) is past the last time IDs can carry; set back to {ours}",
            catalog::database_name_of(dboid)
        );
        persisted = ours;
    }
    if reserved == 0 {
        // The first load since the server started (for a shared entry) or
        // since the session did (for a session's own reservation). A shared
        // entry raises the generators above the mark, once per database. A
        // session needs to only if the database's file is behind its mark
        // (written by a standby's primary, restored from a backup, or not
        // carried by pg_upgrade): otherwise the generators started above the
        // file, or were raised when the file was last written. So sessions
        // never push one another ahead of the clock.
        if !mark.per_session || filed_ms(dboid) < persisted {
            raise_floor(last_replayed_commit_ms());
            admit(dboid, persisted);
        } else if persisted >= need_ms {
            // Reserved (and flushed, and filed) by an earlier session: take it as it is.
            mark.reserved_ms.fetch_max(persisted, Ordering::AcqRel);
            return;
        }
    } else if persisted > reserved && !mark.per_session {
        // Written since by someone else, and not taken at its commit (see
        // `take_restored_mark`): taken now. (A session's own reservation is
        // passed by the other sessions' as a rule: taken as above, never
        // raising the generators to another session's reservation.)
        admit(dboid, persisted);
    }
    let now_ms = clock::unix_us().div_euclid(1000);
    let target = need_ms.max(now_ms).max(persisted) + RESERVE_MS;
    catalog::set_sequence(seq, target);
    WROTE.set(Some(target));
    // The mark is on disk before any value under it is handed out, whether
    // or not the transaction that wrote it commits.
    // SAFETY: flushes up to the end of the record setval just wrote (the
    // insert position itself may lie past a page header not yet written).
    unsafe { pg_sys::XLogFlush(pg_sys::XactLastRecEnd) };
    write_server_file(dboid, target);
    mark.reserved_ms.fetch_max(target, Ordering::AcqRel);
}

/// The mark this backend last wrote itself (`write_mark`), which the check
/// at commit leaves alone.
static WROTE: BackendLocal<Option<i64>> = BackendLocal::new(None);

// ---- marks brought in from elsewhere -------------------------------------------
//
// The invariant: every value handed out, in any database, is above the
// persisted mark of every database of the server that has been taken (and a
// mark is taken when it is loaded, and at the commit of whatever set it). A
// mark further ahead of the clock than the lead bound can be taken only by
// stopping: it is *held*, and no database mints until the clock is within
// the bound of it (then every generator is raised above it) or its database
// is dropped (then nothing can repeat its IDs). The refusal names the
// database, the distance and the cure. Held marks are kept in files of their
// own, `pg_idgen_held.<database OID>`, never in the mark files.

/// How far ahead of the clock a mark may be taken at once: the lead bound,
/// plus the reservation a mark holds above what was handed out under it.
fn takeable_lead_ms() -> i64 {
    settings::max_clock_lead_ms() + RESERVE_MS
}

/// Takes database `dboid`'s persisted mark (Unix ms) as what every generator
/// must stay above: raises them all, or holds the mark if it is too far
/// ahead (and refuses).
fn admit(dboid: u32, persisted_ms: i64) {
    if persisted_ms - clock::unix_us().div_euclid(1000) > takeable_lead_ms() {
        hold(dboid, persisted_ms);
        check_held();
    }
    raise_floor(persisted_ms);
}

const HELD_PREFIX: &str = "held.";

/// Holds a database's mark: in shared memory, where every mint checks it,
/// and in a file, so that a restart holds it again.
fn hold(dboid: u32, mark_ms: i64) {
    let state = shared::state().or_raise();
    let Some(slot) = state
        .held
        .iter()
        .find(|h| h.dboid.load(Ordering::Acquire) == dboid)
        .or_else(|| state.held.iter().find(|h| h.dboid.compare_exchange(0, dboid, Ordering::SeqCst, Ordering::SeqCst).is_ok()))
    else {
        // Every slot holds another database's mark: this one is taken as
        // if within the bound, so nothing is lost (the mark is set whether or
        // not this transaction commits). Every generator then stands that far
        // ahead, and minting refuses as after a clock step back, until the
        // clock is within the bound of it.
        pgrx::warning!(
            "pg_idgen: more than {} databases hold a mark ahead of the clock; the mark of database OID {dboid} raises every generator",
            shared::HELD_SLOTS
        );
        raise_floor(mark_ms);
        write_server_file(dboid, mark_ms);
        return;
    };
    write_file(&format!("{HELD_PREFIX}{dboid}"), mark_ms);
    slot.mark_ms.fetch_max(mark_ms, Ordering::SeqCst);
    state.any_held.store(true, Ordering::SeqCst);
}

/// The furthest mark held (Unix ms), 0 when none: what minting waits for.
pub fn held_ms() -> i64 {
    shared::state().map_or(0, |s| s.held.iter().map(|h| h.mark_ms.load(Ordering::Acquire)).max().unwrap_or(0))
}

/// On every mint: nothing while no mark is held (one load). Otherwise each
/// held mark is released if its database is gone, taken if the clock is now
/// within the bound of it, or else refused.
#[inline]
pub fn check_held() {
    let state = shared::state().or_raise();
    if state.any_held.load(Ordering::Acquire) {
        check_held_slowly(state);
    }
}

#[cold]
fn check_held_slowly(state: &shared::SharedState) {
    for slot in &state.held {
        let dboid = slot.dboid.load(Ordering::SeqCst);
        let mark_ms = slot.mark_ms.load(Ordering::SeqCst);
        if dboid == 0 || mark_ms == 0 {
            // Free, or being taken by `hold` (its mark comes next).
            continue;
        }
        let ahead_ms = mark_ms - clock::unix_us().div_euclid(1000);
        let exists = database_exists(dboid);
        // A held mark past the last time IDs carry (held by an earlier
        // version) protects no ID: released, as if its database were gone.
        let exists = exists && mark_ms <= last_mark_ms();
        if exists && ahead_ms > takeable_lead_ms() {
            let max_lead_ms = settings::max_clock_lead_ms();
            IdError::MarkAhead {
                database: catalog::database_name_of(dboid),
                ahead_ms,
                max_lead_ms,
                resumes_at: crate::core::layout::format_unix_ms(mark_ms - takeable_lead_ms()),
            }
            .raise()
        }
        // Every backend that gets here raises the generators itself (so none
        // mints below the mark while another is releasing it); one releases.
        if exists {
            raise_floor(mark_ms);
        }
        if slot.mark_ms.compare_exchange(mark_ms, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            if exists {
                write_server_file(dboid, mark_ms);
            }
            datafiles::remove(&format!("{HELD_PREFIX}{dboid}"));
            let _ = slot.dboid.compare_exchange(dboid, 0, Ordering::SeqCst, Ordering::SeqCst);
        }
    }
    // Every slot was free: cleared, unless a mark was held meanwhile (`hold`
    // takes its slot before it sets the flag, so the scan after sees it).
    state.any_held.store(false, Ordering::SeqCst);
    if state.held.iter().any(|h| h.dboid.load(Ordering::SeqCst) != 0) {
        state.any_held.store(true, Ordering::SeqCst);
    }
}

/// At the commit (or PREPARE) of a transaction that set this database's mark
/// (the `setval` of a restore: pg_restore, pg_dumpall, psql of a dump, and
/// pg_upgrade, whose dump sets every sequence), the mark is taken at once,
/// before anything else mints: every generator is raised above it and it is
/// filed in the data directory (pg_upgrade's too), so that from then on, and
/// after any restart, no database mints an ID the restored data may hold; or
/// it is held (see above). A restore that would lower the mark below what
/// this server reserved is undone, so the mark stays at or above every value.
fn take_restored_mark() {
    // SAFETY: reads this backend's own globals.
    let (wrote_wal, dboid) = unsafe { (pg_sys::XactLastRecEnd != 0, pg_sys::MyDatabaseId.to_u32()) };
    let wrote_myself = WROTE.get();
    WROTE.set(None);
    let sub_aborted = SUB_ABORTED.get();
    SUB_ABORTED.set(false);
    if !wrote_wal || dboid == 0 || shared::state().is_err() {
        return;
    }
    let generation = catalog::generation();
    let Some(seq) = catalog::relation(c"pg_idgen_hwm") else { return };
    SEQ_SEEN.set(Some((generation, seq)));
    // A setval in a subtransaction rolled back (ROLLBACK TO SAVEPOINT) stays,
    // as setval is not transactional, but its lock went with the
    // subtransaction: after one, the mark is read whatever the locks say.
    if !catalog::sequence_touched(seq) && !sub_aborted {
        return;
    }
    // Serialized with `extend`, and released at once (not held through the
    // rest of the commit, where others would wait behind it).
    catalog::lock(seq, pg_sys::ShareUpdateExclusiveLock);
    let persisted = catalog::with_latest_snapshot(|| catalog::as_superuser(|| catalog::sequence_value(seq)));
    if Some(persisted) != wrote_myself {
        let entry = MY_MARK.get().or_else(|| shared::find_mark(dboid));
        let ours = entry.map_or(0, |m| m.reserved_ms.load(Ordering::Acquire)).max(filed_ms(dboid));
        let last_ms = last_mark_ms();
        if persisted < ours || persisted > last_ms {
            catalog::as_superuser(|| catalog::with_latest_snapshot(|| catalog::set_sequence(seq, ours)));
            if persisted > last_ms {
                catalog::unlock(seq, pg_sys::ShareUpdateExclusiveLock);
                IdError::MarkPastRange {
                    database: catalog::database_name(),
                    mark_ms: persisted,
                    last: crate::core::layout::format_unix_ms(last_ms),
                }
                .raise()
            }
        } else if persisted == ours {
            // As this server already has it (a rolled-back setval of the same value, or none).
        } else if persisted - clock::unix_us().div_euclid(1000) > takeable_lead_ms() {
            hold(dboid, persisted);
        } else {
            raise_floor(persisted);
            write_server_file(dboid, persisted);
        }
    }
    catalog::unlock(seq, pg_sys::ShareUpdateExclusiveLock);
}

/// Registers the check of `take_restored_mark` at every commit. Called from
/// `_PG_init` while preloading: every backend inherits it.
pub fn init() {
    // SAFETY: registered once, in the postmaster, before any backend exists.
    unsafe {
        pg_sys::RegisterXactCallback(Some(xact_callback), std::ptr::null_mut());
        pg_sys::RegisterSubXactCallback(Some(subxact_callback), std::ptr::null_mut());
    }
}

/// Set when a subtransaction that may have set the mark aborts (see
/// `take_restored_mark`); cleared at the end of the transaction.
static SUB_ABORTED: BackendLocal<bool> = BackendLocal::new(false);

/// The mark sequence of this backend's database as last found, with the
/// catalog generation it was found at.
static SEQ_SEEN: BackendLocal<Option<(u64, pg_sys::Oid)>> = BackendLocal::new(None);

/// Notes the abort of a subtransaction that holds a lock on the mark
/// sequence (a setval or nextval in it; its locks are released after this
/// callback), without catalog access: the sequence as last found, while the
/// catalog has not changed since; any abort when it is not known. So a
/// transaction whose rolled-back savepoints never touched the mark reads
/// nothing more at commit.
#[pg_guard]
unsafe extern "C-unwind" fn subxact_callback(
    event: pg_sys::SubXactEvent::Type,
    _sub: pg_sys::SubTransactionId,
    _parent: pg_sys::SubTransactionId,
    _arg: *mut std::ffi::c_void,
) {
    if event == pg_sys::SubXactEvent::SUBXACT_EVENT_ABORT_SUB && !SUB_ABORTED.get() {
        let touched = match SEQ_SEEN.get() {
            Some((generation, seq)) if generation == catalog::generation() => catalog::sequence_touched(seq),
            _ => true,
        };
        SUB_ABORTED.set(touched);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn xact_callback(event: pg_sys::XactEvent::Type, _arg: *mut std::ffi::c_void) {
    use pg_sys::XactEvent::*;
    match event {
        // May raise: the transaction then aborts.
        XACT_EVENT_PRE_COMMIT | XACT_EVENT_PRE_PREPARE => take_restored_mark(),
        XACT_EVENT_ABORT => {
            WROTE.set(None);
            SUB_ABORTED.set(false);
        }
        _ => {}
    }
}

/// The file of a database's reservation, in pg_idgen's directory of the
/// data directory (see `datafiles`).
const FILE_PREFIX: &str = "mark.";
/// The file that keeps the largest reservation of dropped databases
/// (OID 0 is never a database's).
const DROPPED_FILE: &str = "mark.0";

/// Also keeps the reservation in the data directory, one file per database,
/// written durably: after a restart or a crash every generator starts above
/// every database's reservation, whichever database mints first. (Standbys
/// rely on the sequences, which replicate.)
fn write_server_file(dboid: u32, target_ms: i64) {
    write_file(&format!("{FILE_PREFIX}{dboid}"), target_ms)
}

/// The reservation a database's file holds (0 without one).
fn filed_ms(dboid: u32) -> i64 {
    read_file(&format!("{FILE_PREFIX}{dboid}"))
}

fn parse(text: Option<String>) -> i64 {
    text.and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

fn read_file(name: &str) -> i64 {
    parse(datafiles::read(name))
}

/// Raises the value a file holds to `target_ms` (a lower one is left as it
/// is), under the lock every writer of pg_idgen's files takes, so that
/// writers (a database's extensions, the release of a held mark, another
/// database's session) neither clash nor lower a value.
fn write_file(name: &str, target_ms: i64) {
    datafiles::update(name, |now| (parse(now) < target_ms).then(|| target_ms.to_string()));
}

/// The mark files of the data directory: (database OID, reservation in Unix
/// ms); an unreadable file counts as 0.
fn mark_files() -> Vec<(u32, i64)> {
    files(FILE_PREFIX)
}

/// The files named `prefix` and a database OID, with their values.
fn files(prefix: &str) -> Vec<(u32, i64)> {
    datafiles::named(prefix)
        .into_iter()
        .filter_map(|(name, oid)| Some((oid.parse::<u32>().ok()?, read_file(&name))))
        .collect()
}

/// Folds the files of databases that no longer exist into the one file of
/// dropped databases, which keeps their largest reservation (so restart
/// floors stay where they were), and removes them. Run by the loader after
/// each start and promotion, the only process that writes that file.
pub fn fold_files_of_dropped_databases() {
    let listed = mark_files();
    // A database's file is written only once the database exists: with a
    // catalog snapshot taken after the listing, every one of them is seen.
    // SAFETY: drops this backend's catalog snapshot; the next lookup takes a new one.
    unsafe { pg_sys::InvalidateCatalogSnapshot() };
    let dropped: Vec<u32> = listed.iter().map(|(oid, _)| *oid).filter(|oid| *oid != 0 && !database_exists(*oid)).collect();
    // Values read again now that their databases are known to be gone.
    let files = mark_files();
    let value = |oid: u32| files.iter().find(|(o, _)| *o == oid).map_or(0, |(_, ms)| *ms);
    let kept = value(0);
    let largest = dropped.iter().map(|oid| value(*oid)).max().unwrap_or(0);
    if largest > kept {
        write_file(DROPPED_FILE, largest);
    }
    for oid in dropped {
        datafiles::remove(&format!("{FILE_PREFIX}{oid}"));
    }
}

/// Where the state starts after a (re)start of the server: every generator
/// above the largest reservation any database recorded in the data
/// directory, and the held marks held again. Called in the postmaster when
/// shared memory is initialized.
pub fn restart_state() -> shared::Start {
    let max_ms = mark_files().into_iter().map(|(_, ms)| ms).max().unwrap_or(0);
    let floor = |ms: i64, bits: u32| if ms > 0 { ((ms as u64) << bits) - 1 } else { 0 };
    let (id_floor, uuid_floor) = if max_ms > 0 {
        (floor(max_ms + 1 - settings::configured_epoch_ms(), ID_TICKS.bits), floor(max_ms + 1, UUID_TICKS.bits))
    } else {
        (0, 0)
    };
    let held = files(HELD_PREFIX).into_iter().take(shared::HELD_SLOTS).collect();
    shared::Start { id_floor, uuid_floor, held }
}

/// The time (Unix ms) of the last transaction replayed from WAL since this
/// server started: after a crash recovery or a promotion, every ID of every
/// committed and replayed transaction, in any database, was minted at or
/// before it on the old primary's clock (unless it was borrowed ahead of that
/// clock). So the first mark loaded in each database also starts the
/// generators above it: a promoted standby whose clock lags does not repeat
/// IDs another database handed out. 0 when nothing was replayed.
fn last_replayed_commit_ms() -> i64 {
    // SAFETY: reads the recovery state's last replayed commit/abort time.
    let ts = unsafe { pg_sys::GetLatestXTime() };
    if ts == 0 { 0 } else { crate::core::layout::unix_ms_of_timestamptz(ts) }
}

/// The last Unix millisecond a mark may stand at: the last an ID of this
/// server's epoch carries. A mark past it protects no ID.
fn last_mark_ms() -> i64 {
    settings::configured_epoch_ms() + MAX_MS
}

/// Raises every generator so that its next value lies after Unix millisecond `persisted_ms`.
fn raise_floor(persisted_ms: i64) {
    let state = shared::state().or_raise();
    let epoch = settings::configured_epoch_ms();
    for slot in &state.shards {
        generator::raise_floor(&slot.last, ID_TICKS, persisted_ms + 1 - epoch);
    }
    generator::raise_floor(&state.uuid.last, UUID_TICKS, persisted_ms + 1);
}

/// Refuses to mint in a read-only transaction (and so on a hot standby), as
/// `nextval` does: the mark could not be written there.
#[inline]
pub fn check_writable(function: &'static str) {
    if read_only() {
        IdError::ReadOnly(function).raise()
    }
}

#[inline]
pub fn read_only() -> bool {
    // SAFETY: reads a plain global flag of this backend.
    unsafe { pg_sys::XactReadOnly }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn minting_in_a_read_only_transaction_is_25006_like_nextval() {
        assert_eq!(sqlstate("1"), "ok");
        Spi::run("SET transaction_read_only = on").unwrap();
        assert_eq!(sqlstate("next_shard_id(1)"), "25006");
        assert_eq!(sqlstate("next_schema_id('public')"), "25006");
        assert_eq!(sqlstate("nextval('pg_idgen_hwm')"), "25006");
        // UUIDs still come, ordered within the backend.
        assert_eq!(one::<i64>("SELECT count(DISTINCT uuid_v7()) FROM generate_series(1, 1000)"), 1000);
    }

    #[pg_test(error = "cannot execute next_shard_id() in a read-only transaction")]
    fn read_only_error_names_the_function() {
        Spi::run("SET transaction_read_only = on; SELECT next_shard_id(1)").unwrap();
    }

    #[pg_test]
    fn max_databases_is_a_server_start_setting() {
        assert_eq!(one::<String>("SELECT context || ' ' || setting FROM pg_settings WHERE name = 'pg_idgen.max_databases'"), "postmaster 1000");
    }

    #[pg_test]
    fn a_user_without_rights_on_the_mark_can_mint() {
        Spi::run("CREATE ROLE idgen_minter").unwrap();
        assert!(!one::<bool>("SELECT has_sequence_privilege('idgen_minter', 'pg_idgen_hwm', 'UPDATE')"));
        assert!(!one::<bool>("SELECT has_sequence_privilege('idgen_minter', 'pg_idgen_hwm', 'SELECT')"));
        Spi::run("SET ROLE idgen_minter").unwrap();
        assert_eq!(one::<i32>("SELECT id_shard(next_shard_id(1))"), 1);
        assert_eq!(sqlstate("setval('pg_idgen_hwm', 1)"), "42501", "nor can it move the mark");
    }
}
