//! Connections between nodes, counted both ways.
//!
//! Going out: this server's backends together keep at most
//! `pg_idgen.citus_max_connections_per_node` connections open to any one
//! other node, counted in shared memory. A backend needing one more waits
//! for one to close (at most [`WAIT`], cancellable); a backend keeping one
//! it is not using closes it at the end of its transaction while another
//! waits (see [`yield_to_waiters`]), so busy sessions share the connections
//! instead of each keeping its own.
//!
//! Coming in: a session another node opens here (`pg_idgen.forwarded` set
//! at connection start) never takes a slot `superuser_reserved_connections`
//! (or, from PostgreSQL 16, `reserved_connections`) keeps for
//! administrators, whatever its role: it is refused as a non-superuser
//! would be.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, GucContext, GucFlags, GucRegistry, GucSetting, PGRXSharedMemory, PgAtomic};

use super::metadata::Addr;
use crate::errors::IdError;

/// How many other nodes' connections are counted at once.
const MAX_NODES: usize = 256;

/// How long a backend waits for a connection to a node to close.
pub const WAIT: Duration = Duration::from_secs(10);

/// A connection opened more recently than this is kept to the end of the
/// next transaction even while others wait: reconnecting costs a few
/// milliseconds, which each connection then serves for at least this long.
const KEEP_AT_LEAST: Duration = Duration::from_millis(100);

static MAX_PER_NODE: GucSetting<i32> = GucSetting::<i32>::new(16);

/// `pg_idgen.forwarded`: how many times the call a session serves was
/// forwarded (see `libpq::hop`). Defined by hand, not through pgrx, for its
/// check hook.
static mut FORWARDED: c_int = 0;

/// Defines the two settings, whether or not the library is preloaded (a
/// node whose library predates `pg_idgen.forwarded` refuses a session that
/// sets it).
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_idgen.citus_max_connections_per_node",
        c"How many connections this server's sessions keep open to any one other Citus node to mint there.",
        c"A session needing one more waits up to 10 s for one to close; sessions not using theirs close them at \
          transaction end while another waits.",
        &MAX_PER_NODE,
        1,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: defines a setting whose variable is a static of this library,
    // with a check hook that only reads server state.
    unsafe {
        pg_sys::DefineCustomIntVariable(
            c"pg_idgen.forwarded".as_ptr(),
            c"How many times the call this session serves was forwarded between Citus nodes.".as_ptr(),
            c"Set by pg_idgen when a Citus node opens a session on another to mint there; a call is forwarded at most twice.".as_ptr(),
            &raw mut FORWARDED,
            0,
            0,
            2,
            pg_sys::GucContext::PGC_BACKEND,
            0,
            Some(admit_forwarded),
            None,
            None,
        );
    }
}

/// `pg_idgen.forwarded`: 0 in a client's session, 1 or 2 in a session a
/// Citus node opened on this one to mint here.
pub fn forwarded() -> usize {
    // SAFETY: a setting's variable, read on the backend's one thread.
    (unsafe { FORWARDED }).clamp(0, 2) as usize
}

/// The check hook of `pg_idgen.forwarded`: a client backend starting with
/// it set (by another node) is refused when only reserved slots are free,
/// as PostgreSQL refuses a role that is no superuser; this runs after that
/// check, with this session's own slot taken as it was then. Parallel
/// workers copying the setting and any other source pass.
#[pg_guard]
unsafe extern "C-unwind" fn admit_forwarded(newval: *mut c_int, _extra: *mut *mut c_void, source: pg_sys::GucSource::Type) -> bool {
    // SAFETY: the value PostgreSQL checks, and server globals read in this backend.
    let (value, client_backend) = unsafe { (*newval, pg_sys::MyBackendType == pg_sys::BackendType::B_BACKEND) };
    if value > 0 && source == pg_sys::GucSource::PGC_S_CLIENT && client_backend {
        let reserved = reserved_slots();
        if reserved > 0 && !free_slots(reserved) {
            IdError::CitusReservedSlots { reserved }.raise()
        }
    }
    true
}

/// The connection slots kept for superusers (and, from 16, for roles
/// granted `pg_use_reserved_connections`).
fn reserved_slots() -> i32 {
    // SAFETY: settings' variables, read in this backend.
    #[cfg(feature = "pg15")]
    unsafe {
        pg_sys::ReservedBackends
    }
    // SAFETY: as above.
    #[cfg(not(feature = "pg15"))]
    unsafe {
        pg_sys::SuperuserReservedConnections + pg_sys::ReservedConnections
    }
}

/// Whether at least `n` connection slots are free.
fn free_slots(n: i32) -> bool {
    // SAFETY: reads the free list under its own lock.
    #[cfg(feature = "pg15")]
    unsafe {
        pg_sys::HaveNFreeProcs(n)
    }
    // SAFETY: as above; the count is written to a local.
    #[cfg(not(feature = "pg15"))]
    unsafe {
        let mut free = 0;
        pg_sys::HaveNFreeProcs(n, &mut free)
    }
}

/// Open connections to one node, from every backend of this server.
struct Node {
    /// A hash of the node's address, or 0 for a free entry.
    key: AtomicU64,
    open: AtomicU32,
    /// Backends waiting to open one.
    waiting: AtomicU32,
}

pub struct Pool {
    nodes: [Node; MAX_NODES],
}

// SAFETY: only atomics, valid in any process that maps them.
unsafe impl PGRXSharedMemory for Pool {}

// SAFETY: the name is ours alone among shared memory segments.
static POOL: PgAtomic<Pool> = unsafe { PgAtomic::new(c"pg_idgen citus connections") };

/// Requests the counts' shared memory; called while preloading, with Citus.
pub fn init() {
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Node = Node { key: AtomicU64::new(0), open: AtomicU32::new(0), waiting: AtomicU32::new(0) };
    pg_shmem_init!(POOL = Pool { nodes: [FREE; MAX_NODES] });
}

/// The right to keep one connection open to a node: given back when dropped.
pub struct Slot {
    node: &'static Node,
    opened: Instant,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.node.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slot {
    /// Whether another backend waits for a connection to this node, and
    /// this one has served long enough to be closed for it.
    pub fn should_yield(&self) -> bool {
        self.node.waiting.load(Ordering::Acquire) > 0 && self.opened.elapsed() >= KEEP_AT_LEAST
    }
}

/// Counts as waiting on a node while alive.
struct Waiting(&'static Node);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

fn key(addr: &Addr) -> u64 {
    // FNV-1a of "host:port"; two nodes sharing a hash share a count (a
    // tighter bound, never a looser one).
    let h = addr.describe().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    h.max(1)
}

/// The entry of `key`, taking a free one (or one no backend uses) the first time.
fn entry(key: u64) -> Option<&'static Node> {
    let nodes = &POOL.get().nodes;
    if let Some(n) = nodes.iter().find(|n| n.key.load(Ordering::Acquire) == key) {
        return Some(n);
    }
    nodes.iter().find(|n| {
        let old = n.key.load(Ordering::Acquire);
        let unused = old == 0 || (n.open.load(Ordering::Acquire) == 0 && n.waiting.load(Ordering::Acquire) == 0);
        unused && n.key.compare_exchange(old, key, Ordering::AcqRel, Ordering::Acquire).is_ok()
    })
}

/// The right to open one more connection to `addr`, waiting while this
/// server's backends keep the most allowed; `close_for_others` is called
/// while waiting, for this backend to close those of its own connections
/// that others wait for (two backends each waiting for a node the other
/// keeps a connection to would otherwise wait each other out). Raises
/// 53300 after [`WAIT`].
pub fn acquire(addr: &Addr, function: &'static str, close_for_others: &dyn Fn()) -> Slot {
    let key = key(addr);
    let limit = MAX_PER_NODE.get().max(1) as u32;
    let deadline = Instant::now() + WAIT;
    let mut waiting: Option<Waiting> = None;
    loop {
        if let Some(node) = entry(key) {
            let open = node.open.load(Ordering::Acquire);
            if open < limit && node.open.compare_exchange(open, open + 1, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                let slot = Slot { node, opened: Instant::now() };
                // The entry may have been taken for another node in between:
                // then give the count back and look again.
                if node.key.load(Ordering::Acquire) == key {
                    return slot;
                }
                drop(slot);
                continue;
            }
            if waiting.as_ref().is_none_or(|w| !std::ptr::eq(w.0, node)) {
                node.waiting.fetch_add(1, Ordering::AcqRel);
                waiting = Some(Waiting(node));
            }
        }
        close_for_others();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            IdError::CitusTooManyConnections { node: addr.describe(), function, limit, waited_s: WAIT.as_secs() }.raise()
        }
        sleep(left.min(Duration::from_millis(10)));
    }
}

/// Sleeps on the process latch, raising a cancel or shutdown.
fn sleep(d: Duration) {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as c_int;
    // SAFETY: waits on our own latch, then resets it before looking for interrupts.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events, d.as_millis().max(1) as std::ffi::c_long, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}
