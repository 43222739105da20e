//! Generator state in shared memory: one slot per logical shard, one for
//! UUIDv7, the server's shard ownership, and (in a segment of its own, sized
//! by `pg_idgen.max_databases`) each database's reserved high-water mark.
//! Present only when the library is preloaded.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};

use crate::core::generator::{Minted, TickFormat};
use crate::datafiles::LOCK as FILES_LOCK;
use crate::core::layout::MAX_SHARD;
use crate::errors::{IdError, LoaderState};

/// One generator's state and counters, alone on its cache line so that
/// backends minting for different shards do not slow each other down.
#[repr(C, align(64))]
pub struct Slot {
    /// The last tick handed out (see `generator`); 0 before the first.
    pub last: AtomicU64,
    /// The latest clock reading seen, as a tick.
    pub clock_seen: AtomicU64,
    pub minted: AtomicU64,
    /// Calls that slept for the clock to catch up.
    pub waits: AtomicU64,
    /// Milliseconds entered ahead of the clock.
    pub borrowed_ms: AtomicU64,
    /// Values handed out while the clock read earlier than a reading seen before.
    pub clock_regressions: AtomicU64,
}

impl Slot {
    // A template for array repeats (each element a fresh copy), never shared.
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Slot = Slot {
        last: AtomicU64::new(0),
        clock_seen: AtomicU64::new(0),
        minted: AtomicU64::new(0),
        waits: AtomicU64::new(0),
        borrowed_ms: AtomicU64::new(0),
        clock_regressions: AtomicU64::new(0),
    };

    /// Counts one value handed out, when `track` (`pg_idgen.track_status`) is on.
    #[inline]
    pub fn record(&self, m: &Minted, fmt: TickFormat, track: bool) {
        if !track {
            return;
        }
        self.minted.fetch_add(1, Ordering::Relaxed);
        let now_ms = m.now >> fmt.bits;
        let seen_ms = self.clock_seen.load(Ordering::Relaxed) >> fmt.bits;
        if now_ms > seen_ms {
            // A plain store, not fetch_max: a race between two backends in
            // the same millisecond can only blur a statistic, and a locked
            // instruction here would cost every ID.
            self.clock_seen.store(m.now, Ordering::Relaxed);
        } else if now_ms < seen_ms {
            self.clock_regressions.fetch_add(1, Ordering::Relaxed);
        }
        if m.waited {
            self.waits.fetch_add(1, Ordering::Relaxed);
        }
        if m.borrowed_ms(fmt) {
            self.borrowed_ms.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A database's reservation: values up to `reserved_ms` (Unix ms) are
/// covered by the mark persisted in that database.
pub struct DbMark {
    /// The database, or 0 for a free entry.
    pub dboid: AtomicU32,
    /// 0 until the database's persisted mark is loaded after server start.
    pub reserved_ms: AtomicI64,
    /// A session's own reservation (in its own memory), not a shared entry.
    pub per_session: bool,
}

impl DbMark {
    pub const fn new(dboid: u32) -> DbMark {
        DbMark { dboid: AtomicU32::new(dboid), reserved_ms: AtomicI64::new(0), per_session: false }
    }
}

/// A database's mark that no generator is above yet, because it is further
/// ahead of the clock than the lead bound (see `mark::check_held`).
pub struct Held {
    /// The database, or 0 for a free slot.
    pub dboid: AtomicU32,
    /// The mark, in Unix ms.
    pub mark_ms: AtomicI64,
}

/// How many databases' marks can be held at once.
pub const HELD_SLOTS: usize = 16;

/// Where a (re)started server's state starts (see `mark::restart_state`).
pub struct Start {
    /// Every shard generator's state starts at or above this tick, and the UUID generator's at `uuid_floor`.
    pub id_floor: u64,
    pub uuid_floor: u64,
    /// Held marks, from their files: (database OID, Unix ms).
    pub held: Vec<(u32, i64)>,
}

/// Words of a bitmap with one bit per logical shard.
pub const SHARD_WORDS: usize = (MAX_SHARD as usize + 1) / 64;

/// The server's shard ownership, the same for every database (see `fleet`).
pub struct FleetState {
    /// Set once the ownership recorded in the fleet database is loaded.
    pub loaded: AtomicBool,
    /// Counts publications: a load publishes only if none happened since it began reading.
    pub version: AtomicU64,
    /// Held while an image is being published (a spin lock: a few hundred stores).
    pub publishing: AtomicBool,
    /// The loader's `LoaderState`.
    pub loader_state: AtomicU32,
    /// Mint only the claimed shards (else every shard not released).
    pub claims_only: AtomicBool,
    pub claimed: [AtomicU64; SHARD_WORDS],
    pub released: [AtomicU64; SHARD_WORDS],
}

/// Shard leases from a lease store (see `lease`): what the keeper
/// publishes and every mint reads.
pub struct LeaseState {
    /// A lease store is configured: every shard mints only under a lease.
    pub enabled: bool,
    /// Per shard: the monotonic time (`clock::coarse_ns`) until which it
    /// may mint; 0 when it holds no lease.
    pub valid_until_ns: [AtomicU64; MAX_SHARD as usize + 1],
    /// Per shard: the mark filed in the store (Unix ms), which no ID minted
    /// under the lease passes; published before the validity.
    pub cap_ms: [AtomicI64; MAX_SHARD as usize + 1],
    /// Per shard: the keeper's `LeaseWhy`.
    pub why: [AtomicU32; MAX_SHARD as usize + 1],
}

#[repr(C)]
pub struct SharedState {
    pub shards: [Slot; MAX_SHARD as usize + 1],
    pub uuid: Slot,
    pub fleet: FleetState,
    /// Set once the log has said that sessions keep their own reservations.
    pub fallback_logged: AtomicBool,
    pub held: [Held; HELD_SLOTS],
    /// Set while a slot of `held` may be taken: the one load every mint makes.
    pub any_held: AtomicBool,
    pub leases: LeaseState,
}

// SAFETY: the state is only atomics, valid in any process that maps it.
unsafe impl PGRXSharedMemory for SharedState {}

impl SharedState {
    /// Fresh state whose generators start above the floors of `start`, with its held marks.
    fn new(start: Start) -> Self {
        // Templates for array repeats, as Slot::EMPTY.
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO: AtomicU64 = AtomicU64::new(0);
        #[allow(clippy::declare_interior_mutable_const)]
        const FREE: Held = Held { dboid: AtomicU32::new(0), mark_ms: AtomicI64::new(0) };
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO_I64: AtomicI64 = AtomicI64::new(0);
        #[allow(clippy::declare_interior_mutable_const)]
        const ZERO_U32: AtomicU32 = AtomicU32::new(0);
        let state = SharedState {
            shards: [Slot::EMPTY; MAX_SHARD as usize + 1],
            uuid: Slot::EMPTY,
            fallback_logged: AtomicBool::new(false),
            held: [FREE; HELD_SLOTS],
            any_held: AtomicBool::new(!start.held.is_empty()),
            leases: LeaseState {
                enabled: crate::settings::lease_store().is_some(),
                valid_until_ns: [ZERO; MAX_SHARD as usize + 1],
                cap_ms: [ZERO_I64; MAX_SHARD as usize + 1],
                why: [ZERO_U32; MAX_SHARD as usize + 1],
            },
            fleet: FleetState {
                loaded: AtomicBool::new(false),
                version: AtomicU64::new(0),
                publishing: AtomicBool::new(false),
                loader_state: AtomicU32::new(LoaderState::NotStarted as u32),
                claims_only: AtomicBool::new(false),
                claimed: [ZERO; SHARD_WORDS],
                released: [ZERO; SHARD_WORDS],
            },
        };
        for slot in &state.shards {
            slot.last.store(start.id_floor, Ordering::Relaxed);
        }
        // Asked for from the start (the keeper may not be running yet).
        if state.leases.enabled {
            for s in crate::settings::lease_shards().unwrap_or_default() {
                state.leases.why[s as usize].store(crate::errors::LeaseWhy::Asking as u32, Ordering::Relaxed);
            }
        }
        state.uuid.last.store(start.uuid_floor, Ordering::Relaxed);
        for (slot, (dboid, ms)) in state.held.iter().zip(start.held) {
            slot.dboid.store(dboid, Ordering::Relaxed);
            slot.mark_ms.store(ms, Ordering::Relaxed);
        }
        state
    }

}

/// The mark entries, one per database that mints: `pg_idgen.max_databases`
/// of them, in their own shared memory segment.
pub fn marks() -> &'static [DbMark] {
    let p = MARKS.load(Ordering::Acquire);
    if p.is_null() {
        return &[];
    }
    // SAFETY: set once shared memory is initialized, to an array of
    // MARK_COUNT initialized entries that lives as long as the server.
    unsafe { std::slice::from_raw_parts(p, MARK_COUNT.load(Ordering::Acquire)) }
}

/// The mark entry of a database, if it has one.
pub fn find_mark(dboid: u32) -> Option<&'static DbMark> {
    marks().iter().find(|m| m.dboid.load(Ordering::Acquire) == dboid)
}

/// The mark entry of a database, claiming a free one the first time; None when all are taken.
pub fn mark_of(dboid: u32) -> Option<&'static DbMark> {
    for m in marks() {
        match m.dboid.compare_exchange(0, dboid, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(m),
            Err(owner) if owner == dboid => return Some(m),
            Err(_) => {}
        }
    }
    None
}

/// Takes over the entry of a database that no longer exists (`exists` says
/// which do) for database `dboid`, whose reservation starts afresh.
pub fn reclaim_mark(dboid: u32, exists: impl Fn(u32) -> bool) -> Option<&'static DbMark> {
    for m in marks() {
        let owner = m.dboid.load(Ordering::Acquire);
        if owner != 0 && !exists(owner) && m.dboid.compare_exchange(owner, dboid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            m.reserved_ms.store(0, Ordering::Release);
            return Some(m);
        }
    }
    None
}

// SAFETY: the name is ours alone among shared memory segments.
static STATE: PgAtomic<SharedState> = unsafe { PgAtomic::new(c"pg_idgen generator state") };

/// Where the state starts after a (re)start: see `mark::restart_state`.
static START: std::sync::OnceLock<fn() -> Start> = std::sync::OnceLock::new();

static MARKS: AtomicPtr<DbMark> = AtomicPtr::new(std::ptr::null_mut());
static MARK_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
static mut PREV_SHMEM_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_SHMEM_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;

/// Requests and initialises the shared state as `start()` says (called at
/// every shared-memory initialization, after a crash too), and the mark
/// entries. Called from `_PG_init` while preloading, after the settings are
/// defined.
pub fn init(start: fn() -> Start) {
    let _ = START.set(start);
    pg_shmem_init!(STATE = SharedState::new(start_state()));
    pg_shmem_init!(FILES_LOCK);
    // SAFETY: hooks are chained in the postmaster while preloading, before
    // any other process exists.
    unsafe {
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        request_marks();
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            PREV_SHMEM_REQUEST = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(on_shmem_request);
        }
        PREV_SHMEM_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(on_shmem_startup);
    }
}

fn start_state() -> Start {
    START.get().map_or_else(|| Start { id_floor: 0, uuid_floor: 0, held: Vec::new() }, |f| f())
}

const MARKS_NAME: &std::ffi::CStr = c"pg_idgen database marks";

fn marks_size() -> usize {
    crate::settings::max_databases() * std::mem::size_of::<DbMark>()
}

fn request_marks() {
    // SAFETY: called while shared memory may still be requested.
    unsafe { pg_sys::RequestAddinShmemSpace(marks_size()) };
}

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
#[pg_guard]
unsafe extern "C-unwind" fn on_shmem_request() {
    // SAFETY: the previous hook, called as PostgreSQL would.
    unsafe {
        if let Some(prev) = PREV_SHMEM_REQUEST {
            prev();
        }
    }
    request_marks();
}

#[pg_guard]
unsafe extern "C-unwind" fn on_shmem_startup() {
    // SAFETY: the previous hook, then the segment's creation under
    // AddinShmemInitLock, as PostgreSQL's own modules do; every entry is
    // written before the pointer is published.
    unsafe {
        if let Some(prev) = PREV_SHMEM_STARTUP {
            prev();
        }
        let count = crate::settings::max_databases();
        // AddinShmemInitLock, a macro in C: the 22nd of the main LWLocks.
        let init_lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(init_lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(MARKS_NAME.as_ptr(), marks_size(), &mut found) as *mut DbMark;
        if !found {
            for i in 0..count {
                p.add(i).write(DbMark::new(0));
            }
        }
        pg_sys::LWLockRelease(init_lock);
        MARK_COUNT.store(count, Ordering::Release);
        MARKS.store(p, Ordering::Release);
    }
}

pub fn state() -> Result<&'static SharedState, IdError> {
    if crate::settings::is_preloaded() {
        Ok(STATE.get())
    } else {
        Err(IdError::NotPreloaded)
    }
}

/// True while `shared_preload_libraries` is being processed.
pub fn preloading() -> bool {
    // SAFETY: a plain global flag of the server, read in the process that owns it.
    unsafe { pg_sys::process_shared_preload_libraries_in_progress }
}
