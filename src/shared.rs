//! Generator state in shared memory: one slot per logical shard, one for
//! UUIDv7, and each database's reserved high-water mark. Present only when
//! the library is preloaded.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};

use crate::core::generator::{Minted, TickFormat};
use crate::core::layout::MAX_SHARD;
use crate::errors::IdError;

/// How many databases of one server can mint (each keeps its own mark).
pub const MAX_DATABASES: usize = 64;

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
}

/// Words of a bitmap with one bit per logical shard.
pub const SHARD_WORDS: usize = (MAX_SHARD as usize + 1) / 64;

/// The server's shard ownership, the same for every database (see `fleet`).
pub struct FleetState {
    /// Set once the ownership recorded in the fleet database is loaded.
    pub loaded: AtomicBool,
    /// A loader worker has been started and not yet given up on.
    pub loader_started: AtomicBool,
    /// Mint only the claimed shards (else every shard not released).
    pub claims_only: AtomicBool,
    pub claimed: [AtomicU64; SHARD_WORDS],
    pub released: [AtomicU64; SHARD_WORDS],
}

#[repr(C)]
pub struct SharedState {
    pub shards: [Slot; MAX_SHARD as usize + 1],
    pub uuid: Slot,
    pub marks: [DbMark; MAX_DATABASES],
    pub fleet: FleetState,
}

// SAFETY: the state is only atomics, valid in any process that maps it.
unsafe impl PGRXSharedMemory for SharedState {}

impl SharedState {
    /// Fresh state whose generators start above `floors` (ID ticks, UUID tick).
    fn new(floors: (u64, u64)) -> Self {
        const FREE: DbMark = DbMark { dboid: AtomicU32::new(0), reserved_ms: AtomicI64::new(0) };
        const ZERO: AtomicU64 = AtomicU64::new(0);
        let state = SharedState {
            shards: [Slot::EMPTY; MAX_SHARD as usize + 1],
            uuid: Slot::EMPTY,
            marks: [FREE; MAX_DATABASES],
            fleet: FleetState {
                loaded: AtomicBool::new(false),
                loader_started: AtomicBool::new(false),
                claims_only: AtomicBool::new(false),
                claimed: [ZERO; SHARD_WORDS],
                released: [ZERO; SHARD_WORDS],
            },
        };
        for slot in &state.shards {
            slot.last.store(floors.0, Ordering::Relaxed);
        }
        state.uuid.last.store(floors.1, Ordering::Relaxed);
        state
    }

    /// The mark entry of a database, claiming a free one the first time.
    pub fn mark_of(&self, dboid: u32) -> Result<&DbMark, IdError> {
        for m in &self.marks {
            match m.dboid.compare_exchange(0, dboid, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(m),
                Err(owner) if owner == dboid => return Ok(m),
                Err(_) => {}
            }
        }
        Err(IdError::TooManyDatabases(MAX_DATABASES))
    }

    /// Takes over the entry of a database that no longer exists (`exists`
    /// says which do), for database `dboid`; its reservation starts afresh.
    pub fn reclaim_mark(&self, dboid: u32, exists: impl Fn(u32) -> bool) -> Result<&DbMark, IdError> {
        for m in &self.marks {
            let owner = m.dboid.load(Ordering::Acquire);
            if owner != 0 && !exists(owner) && m.dboid.compare_exchange(owner, dboid, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                m.reserved_ms.store(0, Ordering::Release);
                return Ok(m);
            }
        }
        Err(IdError::TooManyDatabases(MAX_DATABASES))
    }
}

// SAFETY: the name is ours alone among shared memory segments.
static STATE: PgAtomic<SharedState> = unsafe { PgAtomic::new(c"pg_idgen generator state") };

/// Set in the postmaster while preloading; backends inherit it through fork.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Where the generators start after a (re)start: see `mark::restart_floors`.
static FLOORS: std::sync::OnceLock<fn() -> (u64, u64)> = std::sync::OnceLock::new();

/// Requests and initialises the shared state, whose generators start above
/// `floors()` (called at every shared-memory initialization, after a crash
/// too). Called from `_PG_init` while the library is being preloaded.
pub fn init(floors: fn() -> (u64, u64)) {
    let _ = FLOORS.set(floors);
    pg_shmem_init!(STATE = SharedState::new(FLOORS.get().map_or((0, 0), |f| f())));
    PRELOADED.store(true, Ordering::Relaxed);
}

pub fn is_preloaded() -> bool {
    PRELOADED.load(Ordering::Relaxed)
}

pub fn state() -> Result<&'static SharedState, IdError> {
    if is_preloaded() {
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
