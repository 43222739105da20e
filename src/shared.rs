//! Generator state in shared memory: one slot per logical shard and one for
//! UUIDv7. Present only when the library is preloaded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, PGRXSharedMemory, PgAtomic};

use crate::errors::IdError;
use crate::layout::MAX_SHARD;

/// One generator's state, alone on its cache line so that backends minting
/// for different shards do not slow each other down.
#[repr(C, align(64))]
pub struct Slot {
    /// The last tick handed out (see `generator`); 0 before the first.
    pub last: AtomicU64,
}

#[repr(C)]
pub struct SharedState {
    pub shards: [Slot; MAX_SHARD as usize + 1],
    pub uuid: Slot,
}

// SAFETY: the state is only atomics, valid in any process that maps it.
unsafe impl PGRXSharedMemory for SharedState {}

impl SharedState {
    fn new() -> Self {
        const EMPTY: Slot = Slot { last: AtomicU64::new(0) };
        SharedState { shards: [EMPTY; MAX_SHARD as usize + 1], uuid: EMPTY }
    }
}

// SAFETY: the name is ours alone among shared memory segments.
static STATE: PgAtomic<SharedState> = unsafe { PgAtomic::new(c"pg_idgen generator state") };

/// Set in the postmaster while preloading; backends inherit it through fork.
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// Requests and initialises the shared state. Called from `_PG_init` while
/// the library is being preloaded.
pub fn init() {
    pg_shmem_init!(STATE = SharedState::new());
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
