//! Connections between nodes, counted both ways.
//!
//! Going out, when `pg_idgen.citus_max_connections_per_node` is set (0, no
//! bound, by default): this server's backends together keep at most that
//! many connections open to any one other node, each holding a place in
//! shared memory. A backend needing one more takes a free place, or one
//! whose connection has not been used for [`RECLAIM_AFTER`]: the other node
//! ended that session after [`IDLE`] unused (`idle_session_timeout`, set on
//! every connection), so it is closed there whatever its backend here does,
//! idle or in a transaction. The backend that kept it finds its place taken
//! at its next call and connects again. Otherwise it waits its turn, at
//! most [`WAIT`] and cancellably, and raises 53300: first the backends whose
//! role holds the fewest places to the node, among them the longest
//! waiting, so that one role's sessions, however many, cannot keep
//! another's waiting. While it waits, a backend of its role, or of a role
//! holding as many places or more, ending a call or a transaction, closes
//! its connection to that node once it has kept it for [`TURN`], and at the
//! end of a transaction at once unless it calls in a loop (see
//! `libpq::yield_to_waiters`), so that busy sessions (and the shard queries
//! of one distributed statement) share the connections, taking turns: a
//! session calling in a loop pays a new connection (a session start on the
//! other node) once per turn, not once per call.
//!
//! Coming in: a session another node opens here (`pg_idgen.forwarded` set
//! at connection start) never takes a slot `superuser_reserved_connections`
//! (or, from PostgreSQL 16, `reserved_connections`) keeps for
//! administrators, whatever its role: it is refused as a non-superuser
//! would be.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pgrx::prelude::*;
use pgrx::{pg_shmem_init, GucContext, GucFlags, GucRegistry, GucSetting, PGRXSharedMemory, PgAtomic};

use super::metadata::Addr;
use crate::errors::IdError;

/// How many connections this server's backends keep open to other nodes, in all.
const MAX_SLOTS: usize = 1024;

/// How long another node keeps a session of ours that is not used
/// (`idle_session_timeout` in the options of every connection).
pub const IDLE: Duration = Duration::from_secs(2);

/// How long a connection is unused before another backend may take its
/// slot: the other node ended the session by then.
const RECLAIM_AFTER: Duration = Duration::from_secs(4);

/// How long a slot may be marked in use before it counts as abandoned
/// (connecting, preparing and one call each have bounds well below it).
const ABANDONED_AFTER: Duration = Duration::from_secs(180);

/// How long a backend keeps a connection while others wait for one to its
/// node, at the least: its turn. A new connection (a backend started on the
/// other node, statements prepared) took about 20 ms on a loaded 2-CPU
/// machine; a turn of 200 ms pays it once for many calls.
const TURN: Duration = Duration::from_millis(200);

/// How long a backend waits for a slot.
pub const WAIT: Duration = Duration::from_secs(10);

/// How long a backend's wish for a connection to a node lasts: renewed
/// while it waits, so that it lapses by itself if the backend is gone.
const WANTED_FOR: Duration = Duration::from_millis(100);

/// How many backends can note that they wait at once (past it, a waiting
/// backend still takes a place when its turn comes, but the others do not
/// know to give it a turn).
const MAX_WANTED: usize = 256;

/// The most connections to one node (0: no bound, the default; each backend
/// then keeps up to 4 connections of its own). Not bounded by default: past
/// a bound, Citus's shard queries queue for connections, and a repartitioned
/// `INSERT ... SELECT` that ran in seconds unbounded can take minutes.
static MAX_PER_NODE: GucSetting<i32> = GucSetting::<i32>::new(0);

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
        c"How many connections this server's sessions keep open to any one other Citus node to mint there (0: no bound).",
        c"A session needing one more takes the place of one unused for 4 s (the other node ends those after 2 s), \
          or waits its turn, up to 10 s; while one waits, sessions give theirs up after a call once they have kept it 0.2 s.",
        &MAX_PER_NODE,
        0,
        MAX_SLOTS as i32,
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
            #[cfg(feature = "pg15")]
            let settings = "superuser_reserved_connections";
            #[cfg(not(feature = "pg15"))]
            let settings = "superuser_reserved_connections and reserved_connections";
            IdError::CitusReservedSlots { reserved, settings }.raise()
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

/// One connection's place: the node it goes to, who holds it, and since when.
struct Place {
    /// A hash of the node's address, or 0 for a free place.
    node: AtomicU64,
    /// The holder's generation (changed each time the place is taken) times
    /// two, plus one while a call uses the connection.
    word: AtomicU64,
    /// When the last call ended (or, while one runs, began), in monotonic
    /// nanoseconds, the same in every process.
    since: AtomicU64,
    /// The role the connection is made as (its OID).
    role: AtomicU64,
}

/// A backend waiting to connect to a node as a role: since when, and until
/// when the wish lasts unless renewed (monotonic nanoseconds); and how many
/// places to the node its role held when it last looked (see
/// [`Wanted::before`]).
struct Wanted {
    node: AtomicU64,
    first: AtomicU64,
    until: AtomicU64,
    role: AtomicU64,
    held: AtomicU64,
}

impl Wanted {
    fn live(&self, node: u64, t: u64) -> bool {
        self.node.load(Ordering::Acquire) == node && self.until.load(Ordering::Acquire) > t
    }

    /// Whether this wish's turn comes before that of a backend of `role`,
    /// waiting since `first`, whose role holds `held` places: the same
    /// role's in the order they began to wait; another role's in the order
    /// of the places each holds (as last noted), then of waiting.
    fn before(&self, role: u64, held: u64, first: u64) -> bool {
        let theirs = self.first.load(Ordering::Acquire);
        if self.role.load(Ordering::Acquire) == role {
            theirs < first
        } else {
            (self.held.load(Ordering::Acquire), theirs) < (held, first)
        }
    }
}

pub struct Pool {
    /// Held while places are counted, taken or given back, or a wish noted
    /// (a spin lock: a scan of the arrays, no call that can fail).
    lock: AtomicBool,
    places: [Place; MAX_SLOTS],
    wanted: [Wanted; MAX_WANTED],
}

// SAFETY: only atomics, valid in any process that maps them.
unsafe impl PGRXSharedMemory for Pool {}

// SAFETY: the name is ours alone among shared memory segments.
static POOL: PgAtomic<Pool> = unsafe { PgAtomic::new(c"pg_idgen citus connections") };

/// Set while preloading with Citus (inherited by every backend).
static READY: AtomicBool = AtomicBool::new(false);

/// Requests the places' shared memory; called while preloading, with Citus.
pub fn init() {
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: Place = Place { node: AtomicU64::new(0), word: AtomicU64::new(0), since: AtomicU64::new(0), role: AtomicU64::new(0) };
    #[allow(clippy::declare_interior_mutable_const)]
    const NONE: Wanted =
        Wanted { node: AtomicU64::new(0), first: AtomicU64::new(0), until: AtomicU64::new(0), role: AtomicU64::new(0), held: AtomicU64::new(0) };
    pg_shmem_init!(POOL = Pool { lock: AtomicBool::new(false), places: [FREE; MAX_SLOTS], wanted: [NONE; MAX_WANTED] });
    READY.store(true, Ordering::Relaxed);
}

fn pool() -> &'static Pool {
    if !READY.load(Ordering::Relaxed) {
        IdError::NotPreloaded.raise()
    }
    POOL.get()
}

/// Runs `f` on the pool under its lock.
fn locked<T>(f: impl FnOnce(&'static Pool) -> T) -> T {
    let pool = pool();
    // Spins a little, then gives the CPU up between tries, so that many
    // waiting backends do not keep the holder from running.
    let mut tries = 0u32;
    while pool.lock.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        tries += 1;
        if tries < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let out = f(pool);
    pool.lock.store(false, Ordering::Release);
    out
}

/// `struct timespec` on 64-bit Linux.
#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: c_int, tp: *mut Timespec) -> c_int;
}

/// Monotonic nanoseconds (CLOCK_MONOTONIC: the same clock in every process,
/// never stepped).
fn now() -> u64 {
    const CLOCK_MONOTONIC: c_int = 1;
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes the time into a local.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

const BUSY: u64 = 1;

/// A connection's place, held by this backend: given back when dropped,
/// unless another backend took it meanwhile.
pub struct Slot {
    index: usize,
    /// The generation this backend took it at, times two.
    generation: u64,
    node: u64,
    /// When this backend took it (monotonic nanoseconds).
    taken: u64,
    role: u64,
}

impl Slot {
    fn place(&self) -> &'static Place {
        &pool().places[self.index]
    }

    /// Marks the connection in use for a call: false if another backend took
    /// the place (the connection is closed at the other end by then).
    pub fn begin_call(&self) -> bool {
        let p = self.place();
        let taken = p.word.compare_exchange(self.generation, self.generation | BUSY, Ordering::AcqRel, Ordering::Acquire).is_ok();
        if taken {
            p.since.store(now(), Ordering::Release);
        }
        taken
    }

    /// The node's key.
    pub fn node(&self) -> u64 {
        self.node
    }

    /// Whether another backend waits for a connection to this one's node,
    /// of this one's role or of one holding no more places there, and this
    /// backend has had its turn ([`TURN`]) or does not `keep_turn`: then
    /// this one is closed at the end of its call or transaction. (A role
    /// holding many places cannot keep another role's sessions waiting.)
    pub fn must_yield(&self, keep_turn: bool) -> bool {
        let t = now();
        if keep_turn && t.saturating_sub(self.taken) < TURN.as_nanos() as u64 {
            return false;
        }
        let pool = pool();
        let mut waiting = pool.wanted.iter().filter(|w| w.live(self.node, t)).peekable();
        if waiting.peek().is_none() {
            return false;
        }
        let mine = held(pool, self.node, self.role);
        waiting.any(|w| w.role.load(Ordering::Acquire) == self.role || w.held.load(Ordering::Acquire) <= mine)
    }

    /// Marks the call over: the connection is unused from now.
    pub fn end_call(&self) {
        let p = self.place();
        p.since.store(now(), Ordering::Release);
        let _ = p.word.compare_exchange(self.generation | BUSY, self.generation, Ordering::AcqRel, Ordering::Acquire);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mine = self.generation;
        locked(|pool| {
            let p = &pool.places[self.index];
            let w = p.word.load(Ordering::Acquire);
            if w & !BUSY == mine {
                p.word.store(mine + 2, Ordering::Release);
                p.node.store(0, Ordering::Release);
            }
        });
    }
}

fn key(addr: &Addr) -> u64 {
    // FNV-1a of "host:port"; two nodes sharing a hash share a count (a
    // tighter bound, never a looser one).
    let h = addr.describe().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3));
    h.max(1)
}

/// How many places to node `key` connections made as `role` hold.
fn held(pool: &Pool, key: u64, role: u64) -> u64 {
    pool.places.iter().filter(|p| p.node.load(Ordering::Acquire) == key && p.role.load(Ordering::Acquire) == role).count() as u64
}

/// Whether connections to other nodes are bounded (`pg_idgen.citus_max_connections_per_node` > 0).
pub fn bounded() -> bool {
    MAX_PER_NODE.get() > 0
}

/// A place for one more connection to `addr` as `role`, marked in use: a
/// free one while this server keeps fewer than the most allowed to that
/// node, else one whose connection has gone unused for RECLAIM_AFTER (or
/// was abandoned in use). A free place goes to the waiting backend whose
/// role holds the fewest places to the node, among those to the one that
/// has waited longest. `close_own` closes this backend's own unused
/// connections to the node (once, before it waits). Waits at most WAIT,
/// then raises 53300.
pub fn acquire(addr: &Addr, role: pg_sys::Oid, function: &'static str, close_own: &dyn Fn(u64)) -> Slot {
    let key = key(addr);
    let role = u64::from(role.to_u32());
    let start = now();
    let deadline = start + WAIT.as_nanos() as u64;
    let mut waited = false;
    let mut wish: Option<usize> = None;
    loop {
        let limit = MAX_PER_NODE.get().max(1) as usize;
        let t = now();
        let taken = locked(|pool| {
            let places = &pool.places;
            // The places to the node, and how many of them are this role's: one pass under the lock.
            let (count, mine) = places
                .iter()
                .filter(|p| p.node.load(Ordering::Acquire) == key)
                .fold((0, 0), |(all, ours), p| (all + 1, ours + u64::from(p.role.load(Ordering::Acquire) == role)));
            let ahead = pool.wanted.iter().enumerate().any(|(i, w)| Some(i) != wish && w.live(key, t) && w.before(role, mine, start));
            let reclaimable = |p: &Place| {
                let w = p.word.load(Ordering::Acquire);
                let idle = t.saturating_sub(p.since.load(Ordering::Acquire));
                idle >= (if w & BUSY == 0 { RECLAIM_AFTER } else { ABANDONED_AFTER }).as_nanos() as u64
            };
            let index = if ahead {
                None
            } else if count < limit {
                // A free place, or one of any node unused long enough.
                places.iter().position(|p| p.node.load(Ordering::Acquire) == 0).or_else(|| places.iter().position(reclaimable))
            } else {
                places.iter().position(|p| p.node.load(Ordering::Acquire) == key && reclaimable(p))
            }?;
            let p = &places[index];
            let w = p.word.load(Ordering::Acquire);
            let generation = (w & !BUSY) + 2;
            // A compare-and-swap: the holder may begin a call meanwhile (then
            // the place stays its own, and this backend looks again).
            p.word.compare_exchange(w, generation | BUSY, Ordering::AcqRel, Ordering::Acquire).ok()?;
            p.since.store(t, Ordering::Release);
            p.role.store(role, Ordering::Release);
            p.node.store(key, Ordering::Release);
            if let Some(i) = wish {
                pool.wanted[i].until.store(0, Ordering::Release);
            }
            Some(Slot { index, generation, node: key, taken: t, role })
        });
        if let Some(slot) = taken {
            return slot;
        }
        if !waited {
            waited = true;
            close_own(key);
            continue;
        }
        wish = want(key, role, wish, start, t);
        if now() >= deadline {
            IdError::CitusTooManyConnections { node: addr.describe(), function, limit: limit as u32, waited_s: WAIT.as_secs() }.raise()
        }
        sleep(Duration::from_millis(10));
    }
}

/// Notes (or renews) that this backend has waited since `first` for a
/// connection to node `key` as `role`, for WANTED_FOR from `t`, with the
/// places its role holds there: in its own entry, or one that lapsed (a
/// backend gone lets its wish lapse by itself), or, all being in use, one of
/// a role with at least two entries more than its own, if one of eight it
/// looks at is (so that one role's sessions are unlikely to leave
/// another's unnoted).
fn want(key: u64, role: u64, wish: Option<usize>, first: u64, t: u64) -> Option<usize> {
    let until = t + WANTED_FOR.as_nanos() as u64;
    locked(|pool| {
        let mine = |i: &usize| {
            let w = &pool.wanted[*i];
            w.node.load(Ordering::Acquire) == key && w.role.load(Ordering::Acquire) == role && w.first.load(Ordering::Acquire) == first
        };
        let live = |w: &Wanted| w.until.load(Ordering::Acquire) > t;
        let entries = |r: u64| pool.wanted.iter().filter(|w| live(w) && w.role.load(Ordering::Acquire) == r).count();
        let i = wish.filter(mine).or_else(|| pool.wanted.iter().position(|w| !live(w))).or_else(|| {
            // Eight entries looked at, from a place that varies: a role with
            // many is likely among them, and the work under the lock stays small.
            let own = entries(role);
            (0..8).map(|k| (first as usize / 1000 + k * 31) % MAX_WANTED).find(|&i| entries(pool.wanted[i].role.load(Ordering::Acquire)) > own + 1)
        })?;
        let w = &pool.wanted[i];
        w.node.store(key, Ordering::Release);
        w.role.store(role, Ordering::Release);
        w.held.store(held(pool, key, role), Ordering::Release);
        w.first.store(first, Ordering::Release);
        w.until.store(until, Ordering::Release);
        Some(i)
    })
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
