//! The forwarder: one background worker per server that mints on other
//! nodes for all of the server's backends, over a few connections per node
//! that it alone keeps.
//!
//! A backend that must mint on another node writes its request into a slot
//! in shared memory (how to reach the node, the two statements to prepare
//! there, which shard or schema, how many IDs), wakes the forwarder and
//! sleeps until the answer is in the slot. The forwarder keeps at most
//! `pg_idgen.citus_max_connections_per_node` connections to each node, all
//! databases and hops together, as the extension's owner (with Citus's own
//! `citus.node_conninfo` and `pg_dist_authinfo`); each runs one request at a
//! time, and requests wait in the order they came. So however many sessions
//! mint through this server, the other node sees at most that many sessions
//! from it, and no session holds a connection between its calls. Who may
//! mint was checked here, when the caller called the function, and is
//! checked there again by the caller's role name (see `libpq::mint_statement`).
//!
//! Every wait is bounded: a request waits at most [`WAIT`] to be sent, a
//! connection [`CONNECT_TIMEOUT`] to be made and its statements prepared
//! (its failure fails every request waiting for it, unless another
//! connection can serve them), an answer [`ANSWER_TIMEOUT`]; a connection
//! that breaks under a request is made again once for it. A forwarder that
//! exits fails what it sent and had no answer to; the next one sends the
//! rest. A backend waits at most their sum and a margin, and can
//! be cancelled at any moment: an answer nobody waits for any more is
//! dropped (its IDs are skipped, never handed out).

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pgrx::bgworkers::{BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags};
use pgrx::prelude::*;
use pgrx::{pg_shmem_init, GucContext, GucFlags, GucRegistry, GucSetting, PGRXSharedMemory, PgAtomic};

use super::admission;
use super::libpq::{self, Failure, ANSWER_TIMEOUT, CONNECT_TIMEOUT};
use super::metadata::Addr;
use crate::backend::BackendLocal;
use crate::errors::IdError;

/// How many requests can be under way at once, in all the server.
const SLOTS: usize = 128;
/// How many of them can be for one node: a node that does not answer holds
/// at most these, and the calls to the others go on.
const SLOTS_PER_NODE: usize = SLOTS / 4;
/// The most bytes of the connection string and the two statements.
const KEY: usize = 3072;
/// The most bytes of a schema's name or a shard's number.
const VALUE: usize = 256;
/// The most bytes of a role's name.
const ROLE: usize = pg_sys::NAMEDATALEN as usize;
/// The most bytes of an error's message, detail or hint (cut at a character).
const TEXT: usize = 1024;
/// The most IDs one request asks for.
pub const MAX_IDS: usize = 1024;

/// How long a request waits to be sent before it fails with 53300.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long the forwarder keeps a connection nobody uses (making one again
/// takes milliseconds).
const KEEP: Duration = Duration::from_secs(10);
/// How long the other node keeps a session of the forwarder's that is not
/// used (if the forwarder stopped without closing it).
const IDLE_THERE: Duration = Duration::from_secs(20);
/// How long a connection is kept for its key before another key (a
/// database, a hop) may take it at the bound (or, once used, a request of
/// another key that waited as long): with more keys than the bound,
/// connections pass from key to key about this often, not at every call.
const TENURE: Duration = Duration::from_secs(1);
/// How long the forwarder opens no further connection to a node that refused
/// one, for a key that has a connection there already.
const BACK_OFF: Duration = Duration::from_secs(1);

/// The most connections to one node (the default is small: they are
/// shared, and each runs a call in well under a millisecond).
static MAX_PER_NODE: GucSetting<i32> = GucSetting::<i32>::new(4);

// A slot's states. A backend takes a FREE slot (WRITING), fills it and
// queues it; the forwarder takes it (TAKEN) and answers (DONE); the backend
// reads the answer and frees it. A backend that stops waiting frees a
// QUEUED slot itself, and marks a TAKEN one ABANDONED for the forwarder to
// free once its call is over.
const FREE: u32 = 0;
const WRITING: u32 = 1;
const QUEUED: u32 = 2;
const TAKEN: u32 = 3;
const DONE: u32 = 4;
const ABANDONED: u32 = 5;

// What an answer holds.
const IDS: u32 = 0;
const BROKEN: u32 = 1;
const REMOTE: u32 = 2;
const BUSY: u32 = 3;

/// Up to TEXT bytes of text, or none.
struct Text {
    len: u32,
    bytes: [u8; TEXT],
}

const NONE: u32 = u32::MAX;

impl Text {
    fn put(&mut self, s: Option<&str>) {
        self.len = match s {
            None => NONE,
            Some(s) => put(&mut self.bytes, s),
        };
    }

    fn get(&self) -> Option<String> {
        (self.len != NONE).then(|| String::from_utf8_lossy(&self.bytes[..self.len as usize]).into_owned())
    }
}

/// Copies as much of `s` as fits into `to`, cut at a character; its length.
fn put(to: &mut [u8], s: &str) -> u32 {
    let mut n = s.len().min(to.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    to[..n].copy_from_slice(&s.as_bytes()[..n]);
    n as u32
}

/// A request and its answer. Written only by whoever the slot's state says
/// owns it: the backend while WRITING (and reading the answer once DONE),
/// the forwarder while TAKEN.
struct Exchange {
    schema: bool,
    n: u32,
    key_len: u32,
    key: [u8; KEY],
    value_len: u32,
    value: [u8; VALUE],
    /// The calling role's name, which the minting node checks too.
    role_len: u32,
    role: [u8; ROLE],
    /// The function the caller called, which the minting node checks too.
    checked_len: u32,
    checked: [u8; VALUE],
    outcome: u32,
    count: u32,
    ids: [i64; MAX_IDS],
    sqlstate: [u8; 5],
    message: Text,
    detail: Text,
    hint: Text,
}

struct Slot {
    state: AtomicU32,
    /// The order requests came in.
    ticket: AtomicU64,
    /// The node a request is for (see `node_key`), while the slot is not FREE.
    node: AtomicU64,
    /// The waiting backend's latch (in its PGPROC, in shared memory).
    latch: AtomicUsize,
    /// Set by the forwarder when it sends the request: a forwarder started
    /// after one that exited queues again what that one took and never sent.
    sent: AtomicBool,
    exchange: UnsafeCell<Exchange>,
}

pub struct Queue {
    /// The forwarder's latch while it runs, 0 before.
    latch: AtomicUsize,
    tickets: AtomicU64,
    slots: [Slot; SLOTS],
}

// SAFETY: atomics, and exchanges that only the owner its slot's state names
// reads or writes; nothing in it points into one process's memory.
unsafe impl PGRXSharedMemory for Queue {}

// SAFETY: the name is ours alone among shared memory segments.
static QUEUE: PgAtomic<Queue> = unsafe { PgAtomic::new(c"pg_idgen forwarder") };

/// Set while preloading with Citus (inherited by every backend).
static READY: AtomicBool = AtomicBool::new(false);

/// Defines `pg_idgen.citus_max_connections_per_node`, preloaded or not.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_idgen.citus_max_connections_per_node",
        c"How many connections this server's forwarder keeps open to any one other Citus node to mint there.",
        c"Every session of this server mints on other nodes through them, one call at a time each, in the order the calls came; \
          a call waits at most 10 s for one.",
        &MAX_PER_NODE,
        1,
        64,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// Requests the slots' shared memory and registers the forwarder; called
/// while preloading, with Citus. Not during `pg_upgrade`.
pub fn init() {
    #[allow(clippy::declare_interior_mutable_const)]
    const EMPTY: Text = Text { len: NONE, bytes: [0; TEXT] };
    #[allow(clippy::declare_interior_mutable_const)]
    const SLOT: Slot = Slot {
        state: AtomicU32::new(FREE),
        ticket: AtomicU64::new(0),
        node: AtomicU64::new(0),
        latch: AtomicUsize::new(0),
        sent: AtomicBool::new(false),
        exchange: UnsafeCell::new(Exchange {
            schema: false,
            n: 0,
            key_len: 0,
            key: [0; KEY],
            value_len: 0,
            value: [0; VALUE],
            role_len: 0,
            role: [0; ROLE],
            checked_len: 0,
            checked: [0; VALUE],
            outcome: IDS,
            count: 0,
            ids: [0; MAX_IDS],
            sqlstate: [0; 5],
            message: EMPTY,
            detail: EMPTY,
            hint: EMPTY,
        }),
    };
    pg_shmem_init!(QUEUE = Queue { latch: AtomicUsize::new(0), tickets: AtomicU64::new(0), slots: [SLOT; SLOTS] });
    READY.store(true, Ordering::Relaxed);
    // SAFETY: a plain global flag of the server.
    if unsafe { pg_sys::IsBinaryUpgrade } {
        return;
    }
    BackgroundWorkerBuilder::new("pg_idgen forwarder")
        .set_type("pg_idgen forwarder")
        .set_library("pg_idgen")
        .set_function("pg_idgen_forwarder")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(1)))
        .load();
}

fn queue() -> &'static Queue {
    if !READY.load(Ordering::Relaxed) {
        IdError::NotPreloaded.raise()
    }
    QUEUE.get()
}

/// A hash of a node's address: the connections to it are counted together.
/// Two nodes sharing a hash share a count (a tighter bound, never a looser).
fn node_key(addr: &Addr) -> u64 {
    addr.describe().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

// ---- the backend's side ----------------------------------------------------------

/// A slot this backend holds: given up when dropped (an answer read, a
/// cancel, an error, a timeout), or when the backend exits without
/// unwinding (a FATAL error, a termination), so that the forwarder drops
/// its answer and the slot is free again.
struct Held(&'static Slot);

/// The slot this backend holds, for its exit.
static HOLDING: BackendLocal<Option<&'static Slot>> = BackendLocal::new(None);

impl Held {
    fn new(slot: &'static Slot) -> Held {
        static REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
        if !REGISTERED.get() {
            REGISTERED.set(true);
            // SAFETY: registers a callback that only gives a slot up.
            unsafe { pg_sys::on_proc_exit(Some(give_up_at_exit), pg_sys::Datum::from(0)) };
        }
        HOLDING.set(Some(slot));
        Held(slot)
    }
}

fn give_up(slot: &Slot) {
    let s = &slot.state;
    // The forwarder moves a slot QUEUED -> TAKEN -> DONE, and a forwarder
    // starting anew TAKEN -> QUEUED, each at most once: a few tries always do.
    for _ in 0..8 {
        let (now, then) = match s.load(Ordering::Acquire) {
            QUEUED => (QUEUED, FREE),
            TAKEN => (TAKEN, ABANDONED),
            // WRITING or DONE: still this backend's.
            now => (now, FREE),
        };
        if s.compare_exchange(now, then, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            return;
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        HOLDING.set(None);
        give_up(self.0);
    }
}

unsafe extern "C-unwind" fn give_up_at_exit(_code: c_int, _arg: pg_sys::Datum) {
    if let Some(slot) = HOLDING.get() {
        HOLDING.set(None);
        give_up(slot);
    }
}

/// Sleeps on this backend's latch for at most `ms`, then raises a pending
/// cancel or termination.
fn nap(ms: i64) {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as c_int;
    // SAFETY: waits on and resets this backend's own latch.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events, ms as _, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}

fn wake_forwarder(q: &Queue) {
    let latch = q.latch.load(Ordering::Acquire);
    if latch != 0 {
        // SAFETY: the forwarder's latch, in its PGPROC in shared memory
        // (valid for the server's life, whoever uses that PGPROC now).
        unsafe { pg_sys::SetLatch(latch as *mut pg_sys::Latch) };
    }
}

/// `n` IDs of a logical shard (`schema` false, `value` its number) or of a
/// schema's, minted by the node at `addr` in the order it minted them,
/// through the forwarder, for a call of `function` (`checked` its signature
/// there); raises what went wrong. `what` names the node.
pub fn mint(addr: &Addr, schema: bool, value: &str, n: u32, function: &'static str, checked: &str, what: &dyn Fn() -> String) -> Vec<i64> {
    let key = [libpq::conninfo(addr, IDLE_THERE), libpq::mint_statement(false), libpq::mint_statement(true)].join("\0");
    if key.len() > KEY || value.len() > VALUE || checked.len() > VALUE || n as usize > MAX_IDS || n == 0 {
        IdError::Internal(format!("a request to another node is too large ({} bytes, {n} IDs)", key.len())).raise()
    }
    // The role the call is made for: the current one, or in a session another
    // node opened, the one that node named.
    // SAFETY: the current role's name, copied at once.
    let role = admission::forwarded_for()
        .unwrap_or_else(|| unsafe { std::ffi::CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false)) }.to_string_lossy().into_owned());
    let q = queue();
    let start = Instant::now();
    let unreachable = |why: String| -> ! { IdError::CitusUnreachable { what: what(), node: addr.describe(), function, why }.raise() };
    let busy = || -> ! {
        let limit = MAX_PER_NODE.get().max(1) as u32;
        IdError::CitusTooManyConnections { node: addr.describe(), function, limit, waited_s: WAIT.as_secs() }.raise()
    };
    // A free slot, waiting for one at most WAIT, while this node's requests
    // hold fewer than SLOTS_PER_NODE (two backends may both take the last).
    let node = node_key(addr);
    let held = loop {
        let for_node = q.slots.iter().filter(|s| s.state.load(Ordering::Acquire) != FREE && s.node.load(Ordering::Relaxed) == node).count();
        let free = || q.slots.iter().find(|s| s.state.compare_exchange(FREE, WRITING, Ordering::AcqRel, Ordering::Relaxed).is_ok());
        if let Some(s) = (for_node < SLOTS_PER_NODE).then(free).flatten() {
            s.node.store(node, Ordering::Relaxed);
            break Held::new(s);
        }
        if start.elapsed() > WAIT {
            busy()
        }
        nap(5);
    };
    let slot = held.0;
    // SAFETY: the slot is WRITING, so this backend alone touches its exchange.
    unsafe {
        let x = &mut *slot.exchange.get();
        x.schema = schema;
        x.n = n;
        x.key_len = put(&mut x.key, &key);
        x.value_len = put(&mut x.value, value);
        x.role_len = put(&mut x.role, &role);
        x.checked_len = put(&mut x.checked, checked);
        slot.latch.store(&raw mut (*pg_sys::MyProc).procLatch as usize, Ordering::Relaxed);
    }
    slot.ticket.store(q.tickets.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    slot.sent.store(false, Ordering::Relaxed);
    slot.state.store(QUEUED, Ordering::Release);
    wake_forwarder(q);
    // The forwarder answers within WAIT + CONNECT_TIMEOUT + ANSWER_TIMEOUT,
    // twice for a retry; past that it is not running.
    let backstop = WAIT + 2 * (CONNECT_TIMEOUT + ANSWER_TIMEOUT) + Duration::from_secs(5);
    while slot.state.load(Ordering::Acquire) != DONE {
        if start.elapsed() > backstop {
            unreachable(format!("the pg_idgen forwarder of this server did not answer within {} s", backstop.as_secs()))
        }
        nap(100);
        if slot.state.load(Ordering::Acquire) == QUEUED {
            // The forwarder may have started since.
            wake_forwarder(q);
        }
    }
    // SAFETY: DONE: the forwarder wrote the answer and left the exchange.
    let x = unsafe { &*slot.exchange.get() };
    let outcome = x.outcome;
    let ids = x.ids[..x.count.min(MAX_IDS as u32) as usize].to_vec();
    let message = x.message.get().unwrap_or_default();
    let remote = (outcome == REMOTE).then(|| IdError::Relayed {
        sqlstate: String::from_utf8_lossy(&x.sqlstate).into_owned(),
        message: message.clone(),
        detail: x.detail.get(),
        hint: x.hint.get(),
    });
    drop(held);
    match (outcome, remote) {
        (IDS, _) if ids.len() == n as usize => ids,
        (IDS, _) if ids.is_empty() => IdError::CitusNoExecute { function, node: addr.describe(), role }.raise(),
        (IDS, _) => IdError::Internal(format!("another node returned {} IDs of {n}", ids.len())).raise(),
        (BUSY, _) => busy(),
        (_, Some(e)) => e.raise(),
        _ => unreachable(message),
    }
}

// ---- the forwarder ----------------------------------------------------------------

/// A request the forwarder took.
struct Job {
    slot: usize,
    node: u64,
    /// The connection string and the two statements, NUL-separated.
    key: String,
    schema: bool,
    value: String,
    role: String,
    checked: String,
    n: u32,
    tries: u32,
    since: Instant,
}

/// Where a connection stands.
enum Phase {
    /// libpq's connection sequence, waiting to write (or read).
    Connecting(bool),
    /// The statement with this index is being prepared.
    Preparing(usize),
    Idle,
    Busy(Job),
}

struct Conn {
    node: u64,
    key: String,
    conn: *mut c_void,
    phase: Phase,
    /// When the phase began.
    since: Instant,
    /// When it was opened.
    opened: Instant,
    /// Whether a request was sent on it.
    used: bool,
    /// Why it is to be closed.
    dead: Option<String>,
}

impl Conn {
    fn live(&self) -> bool {
        self.dead.is_none()
    }

    fn opening(&self) -> bool {
        matches!(self.phase, Phase::Connecting(_) | Phase::Preparing(_))
    }

    fn idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// How long its phase may last.
    fn limit(&self) -> Duration {
        match self.phase {
            Phase::Connecting(_) | Phase::Preparing(_) => CONNECT_TIMEOUT,
            Phase::Busy(_) => ANSWER_TIMEOUT,
            Phase::Idle => KEEP,
        }
    }
}

struct Forwarder {
    q: &'static Queue,
    jobs: VecDeque<Job>,
    conns: Vec<Conn>,
    /// When each node last refused a connection (or failed it before it was up).
    refused: Vec<(u64, Instant)>,
}

/// The forwarder's main loop: started once recovery is over, again 1 s after
/// it exits (on an error, or when terminated); connected to no database.
#[pg_guard]
#[no_mangle]
pub extern "C-unwind" fn pg_idgen_forwarder(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    BackgroundWorker::connect_worker_to_spi(None, None);
    let q = queue();
    // What a forwarder before this one took and never answered: queued
    // again if it was never sent, failed if it was (the other node may be
    // what stopped that forwarder).
    for (i, s) in q.slots.iter().enumerate() {
        if s.state.load(Ordering::Acquire) == TAKEN && !s.sent.load(Ordering::Acquire) && s.state.compare_exchange(TAKEN, QUEUED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            continue;
        }
        match s.state.load(Ordering::Acquire) {
            TAKEN => answer(q, i, Answer::Failed(Failure::Broken("the pg_idgen forwarder restarted".into()))),
            ABANDONED => s.state.store(FREE, Ordering::Release),
            _ => {}
        }
    }
    // SAFETY: this worker's latch, in its PGPROC.
    q.latch.store(unsafe { pg_sys::MyLatch } as usize, Ordering::Release);
    let mut f = Forwarder { q, jobs: VecDeque::new(), conns: Vec::new(), refused: Vec::new() };
    while !BackgroundWorker::sigterm_received() {
        if BackgroundWorker::sighup_received() {
            // SAFETY: rereads the configuration, as PostgreSQL's own workers do on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        f.take();
        f.expire();
        // Before any new attempt: one that failed fails the calls waiting
        // for it unless a connection there before it ended can serve them.
        f.close_dead();
        f.dispatch();
        f.close_dead();
        f.wait();
        f.close_dead();
    }
    f.conns.drain(..).for_each(|c| libpq::finish(c.conn));
    // SAFETY: ends this worker the way PostgreSQL's own do; code 1 has it
    // started again (after a terminate; at shutdown nothing starts).
    unsafe { pg_sys::proc_exit(1) };
}

/// What the forwarder answers a request.
enum Answer {
    Ids(Vec<i64>),
    Failed(Failure),
    /// It waited WAIT and was never sent.
    Busy,
}

/// Writes an answer into slot `i` and wakes its backend, or frees the slot
/// if its backend stopped waiting.
fn answer(q: &Queue, i: usize, outcome: Answer) {
    let slot = &q.slots[i];
    // SAFETY: TAKEN or ABANDONED: the forwarder alone touches the exchange.
    let x = unsafe { &mut *slot.exchange.get() };
    x.count = 0;
    match outcome {
        Answer::Ids(ids) => {
            x.outcome = IDS;
            x.count = ids.len().min(MAX_IDS) as u32;
            x.ids[..x.count as usize].copy_from_slice(&ids[..x.count as usize]);
        }
        Answer::Failed(Failure::Broken(why)) => {
            x.outcome = BROKEN;
            x.message.put(Some(&why));
        }
        Answer::Failed(Failure::Remote(e)) => {
            x.outcome = REMOTE;
            put(&mut x.sqlstate, &e.sqlstate);
            x.message.put(Some(&e.message));
            x.detail.put(e.detail.as_deref());
            x.hint.put(e.hint.as_deref());
        }
        Answer::Busy => x.outcome = BUSY,
    }
    if slot.state.compare_exchange(TAKEN, DONE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        // SAFETY: the backend's latch, in its PGPROC in shared memory.
        unsafe { pg_sys::SetLatch(slot.latch.load(Ordering::Relaxed) as *mut pg_sys::Latch) };
    } else {
        slot.state.store(FREE, Ordering::Release);
    }
}

impl Forwarder {
    /// Takes the queued requests, in the order they came.
    fn take(&mut self) {
        let mut new: Vec<(u64, Job)> = Vec::new();
        for (i, s) in self.q.slots.iter().enumerate() {
            if s.state.load(Ordering::Acquire) != QUEUED || s.state.compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire).is_err() {
                continue;
            }
            // SAFETY: TAKEN: the backend wrote the request before queueing it.
            let x = unsafe { &*s.exchange.get() };
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let job = Job {
                slot: i,
                node: s.node.load(Ordering::Relaxed),
                key: text(&x.key[..x.key_len as usize]),
                schema: x.schema,
                value: text(&x.value[..x.value_len as usize]),
                role: text(&x.role[..x.role_len as usize]),
                checked: text(&x.checked[..x.checked_len as usize]),
                n: x.n,
                tries: 0,
                since: Instant::now(),
            };
            new.push((s.ticket.load(Ordering::Relaxed), job));
        }
        new.sort_by_key(|(t, _)| *t);
        self.jobs.extend(new.into_iter().map(|(_, j)| j));
    }

    /// Connections and requests past their time. A call that got no answer
    /// within ANSWER_TIMEOUT fails at once (not sent again, to wait as long).
    fn expire(&mut self) {
        for c in &mut self.conns {
            if c.live() && c.since.elapsed() > c.limit() {
                let why = match c.phase {
                    Phase::Busy(_) => format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()),
                    Phase::Idle => "unused".into(),
                    _ => format!("timeout expired after {} s", CONNECT_TIMEOUT.as_secs()),
                };
                if matches!(c.phase, Phase::Busy(_)) {
                    if let Phase::Busy(job) = std::mem::replace(&mut c.phase, Phase::Idle) {
                        answer(self.q, job.slot, Answer::Failed(Failure::Broken(why.clone())));
                    }
                }
                c.dead = Some(why);
            }
        }
        let (q, conns) = (self.q, &self.conns);
        // A request waits WAIT for a connection, unless one is being made for
        // it (that ends within CONNECT_TIMEOUT, and answers it if it fails:
        // also one that failed just now, which `close_dead` answers); never
        // longer than both (attempts that fail beside a connection that is
        // up, but stuck, answer no one).
        let opening = |key: &str| conns.iter().any(|c| c.key == key && c.opening());
        self.jobs.retain(|j| {
            if q.slots[j.slot].state.load(Ordering::Acquire) == ABANDONED {
                q.slots[j.slot].state.store(FREE, Ordering::Release);
                false
            } else if j.since.elapsed() > WAIT + CONNECT_TIMEOUT {
                let why = format!("no connection to it was made within {} s", (WAIT + CONNECT_TIMEOUT).as_secs());
                answer(q, j.slot, Answer::Failed(Failure::Broken(why)));
                false
            } else if j.since.elapsed() > WAIT && !opening(&j.key) {
                answer(q, j.slot, Answer::Busy);
                false
            } else {
                true
            }
        });
    }

    /// Sends what can be sent: each request on an idle connection made with
    /// its key; opens connections for those that have none, within the
    /// bound of each node (closing an idle one of another key if need be).
    fn dispatch(&mut self) {
        let max = MAX_PER_NODE.get().max(1) as usize;
        let mut waiting: Vec<Job> = Vec::new();
        while let Some(job) = self.jobs.pop_front() {
            if let Some(c) = self.conns.iter_mut().find(|c| c.live() && c.key == job.key && c.idle()) {
                self.q.slots[job.slot].sent.store(true, Ordering::Release);
                send(c, job);
                continue;
            }
            let opening = self.conns.iter().filter(|c| c.live() && c.key == job.key && c.opening()).count();
            let ahead = waiting.iter().filter(|w| w.key == job.key).count();
            // A node that refused a connection just now (short of slots,
            // most likely) is not asked for another while this key has one.
            let backing_off = self.refused.iter().any(|(node, at)| *node == job.node && at.elapsed() < BACK_OFF)
                && self.conns.iter().any(|c| c.live() && c.key == job.key);
            // With none up, one attempt at a time: attempts made at once
            // take one another's slots there, and all can be refused where
            // one would have been let in.
            let up = self.conns.iter().any(|c| c.live() && c.key == job.key && !c.opening());
            if (opening == 0 || up && opening <= ahead) && !backing_off {
                let to_node = |conns: &[Conn]| conns.iter().filter(|c| c.live() && c.node == job.node).count();
                // At the bound, another key's idle connection gives way to a
                // key with none, or to one holding at least two fewer: the
                // keys (databases, hops) come to share the node's connections
                // evenly. Once held TENURE, or once used if this request
                // waited TENURE: connections pass between keys about once a
                // second, not at every call, and as often as it takes for
                // no key to wait past WAIT when there are many.
                if to_node(&self.conns) >= max {
                    let held = |key: &str| self.conns.iter().filter(|c| c.live() && c.key == key).count();
                    let mine = held(&job.key);
                    let waited = job.since.elapsed() >= TENURE;
                    let victim = self.conns.iter().position(|c| {
                        let due = c.opened.elapsed() >= TENURE || c.used && waited;
                        c.live() && c.node == job.node && c.idle() && due && (mine == 0 || held(&c.key) >= mine + 2)
                    });
                    if let Some(i) = victim {
                        self.conns[i].dead = Some("another database's or hop's turn".into());
                    }
                }
                if to_node(&self.conns) < max {
                    self.open(&job);
                }
            }
            waiting.push(job);
        }
        self.jobs = waiting.into();
        // A lowered bound: idle connections over it go.
        for node in self.conns.iter().map(|c| c.node).collect::<Vec<_>>() {
            let live = self.conns.iter().filter(|c| c.live() && c.node == node).count();
            let over = live.saturating_sub(max);
            self.conns.iter_mut().filter(|c| c.live() && c.node == node && c.idle()).take(over).for_each(|c| {
                c.dead = Some("over the bound".into());
            });
        }
    }

    fn open(&mut self, job: &Job) {
        let info = CString::new(job.key.split('\0').next().unwrap_or_default()).unwrap_or_default();
        let (conn, dead) = match libpq::connect_start(&info) {
            Ok(conn) => (conn, None),
            Err(why) => (std::ptr::null_mut(), Some(why)),
        };
        let now = Instant::now();
        self.conns.push(Conn { node: job.node, key: job.key.clone(), conn, phase: Phase::Connecting(true), since: now, opened: now, used: false, dead });
    }

    /// Closes the connections marked dead: a request on one is sent again
    /// once, on another; one failing to connect (or to prepare) fails every
    /// request waiting for its key, with its reason, unless another
    /// connection of the key is up or being made (which serves them, or
    /// fails them in turn).
    fn close_dead(&mut self) {
        let (dead, live): (Vec<Conn>, Vec<Conn>) = std::mem::take(&mut self.conns).into_iter().partition(|c| c.dead.is_some());
        self.conns = live;
        for c in dead {
            let why = c.dead.unwrap_or_default();
            if !c.conn.is_null() {
                libpq::finish(c.conn);
            }
            match c.phase {
                Phase::Busy(mut job) => {
                    job.tries += 1;
                    job.since = Instant::now();
                    if job.tries >= 2 {
                        answer(self.q, job.slot, Answer::Failed(Failure::Broken(why)));
                    } else {
                        self.jobs.push_front(job);
                    }
                }
                Phase::Connecting(_) | Phase::Preparing(_) => {
                    self.refused.retain(|(node, _)| *node != c.node);
                    self.refused.push((c.node, Instant::now()));
                    // Another connection of the key, up or being made, serves
                    // the calls (attempts that follow one another keep a call
                    // at most WAIT + CONNECT_TIMEOUT: see `expire`).
                    if self.conns.iter().any(|o| o.key == c.key) {
                        continue;
                    }
                    let q = self.q;
                    self.jobs.retain(|j| {
                        let failed = j.key == c.key;
                        if failed {
                            answer(q, j.slot, Answer::Failed(Failure::Broken(why.clone())));
                        }
                        !failed
                    });
                }
                Phase::Idle => {}
            }
        }
    }

    /// Waits for the latch (a new request, a signal) or a connection's
    /// socket, at most until the next deadline, then moves every connection
    /// whose socket is ready on.
    fn wait(&mut self) {
        let watched: Vec<(usize, u32, c_int)> = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let socket = libpq::socket(c.conn);
                let event = match c.phase {
                    Phase::Connecting(true) => pg_sys::WL_SOCKET_WRITEABLE,
                    _ => pg_sys::WL_SOCKET_READABLE,
                };
                (socket >= 0).then_some((i, event, socket))
            })
            .collect();
        let next = self
            .conns
            .iter()
            .map(|c| c.limit().saturating_sub(c.since.elapsed()))
            // A request past WAIT waits on a connection being made, whose own
            // limit counts.
            .chain(self.jobs.iter().map(|j| WAIT.saturating_sub(j.since.elapsed())).filter(|d| !d.is_zero()))
            .min()
            .unwrap_or(KEEP)
            .min(Duration::from_secs(1));
        let ready = wait_events(&watched, next);
        for i in ready {
            self.step(i);
        }
    }

    /// Moves connection `i` on, its socket being ready.
    fn step(&mut self, i: usize) {
        let q = self.q;
        let c = &mut self.conns[i];
        let statements: Vec<String> = c.key.split('\0').skip(1).map(str::to_owned).collect();
        match std::mem::replace(&mut c.phase, Phase::Idle) {
            Phase::Connecting(_) => match libpq::connect_poll(c.conn) {
                Ok(None) => {
                    c.phase = Phase::Preparing(0);
                    c.since = Instant::now();
                    if let Err(why) = libpq::send_prepare(c.conn, 0, &statements[0]) {
                        c.dead = Some(why);
                    }
                }
                Ok(Some(writing)) => c.phase = Phase::Connecting(writing),
                Err(why) => {
                    c.phase = Phase::Connecting(false);
                    c.dead = Some(why);
                }
            },
            Phase::Preparing(k) => match libpq::read(c.conn) {
                None => c.phase = Phase::Preparing(k),
                Some(Ok(_)) if k + 1 < statements.len() => {
                    c.phase = Phase::Preparing(k + 1);
                    if let Err(why) = libpq::send_prepare(c.conn, k + 1, &statements[k + 1]) {
                        c.dead = Some(why);
                    }
                }
                Some(Ok(_)) => {
                    c.phase = Phase::Idle;
                    c.since = Instant::now();
                }
                Some(Err(f)) => {
                    c.phase = Phase::Preparing(k);
                    c.dead = Some(f.why());
                }
            },
            Phase::Busy(job) => match libpq::read(c.conn) {
                None => c.phase = Phase::Busy(job),
                Some(Err(Failure::Broken(why))) => {
                    c.phase = Phase::Busy(job);
                    c.dead = Some(why);
                }
                Some(outcome) => {
                    // A cancel there (an administrator's, or the session's
                    // statement timeout) is not the caller's own: the call
                    // failed on the other node, not here.
                    let outcome = outcome.map_err(|f| match f {
                        Failure::Remote(e) if e.sqlstate == "57014" => Failure::Broken(format!("{} (on the node called)", e.message)),
                        f => f,
                    });
                    let ids = outcome.and_then(|rows| {
                        rows.iter()
                            .map(|r| r.first().cloned().flatten().and_then(|v| v.parse::<i64>().ok()))
                            .collect::<Option<Vec<i64>>>()
                            .ok_or_else(|| Failure::Broken("another node answered an ID that is not a bigint".into()))
                    });
                    answer(q, job.slot, ids.map_or_else(Answer::Failed, Answer::Ids));
                    c.phase = Phase::Idle;
                    c.since = Instant::now();
                }
            },
            Phase::Idle => {
                // Unasked input: the other node ended the session, or a notice.
                if !libpq::alive(c.conn) {
                    c.dead = Some("closed by the other node".into());
                }
            }
        }
    }
}

/// Sends `job` on idle connection `c`.
fn send(c: &mut Conn, job: Job) {
    let params = [job.value.clone(), job.n.to_string(), job.role.clone(), job.checked.clone()];
    let sent = libpq::send_prepared(c.conn, job.schema as usize, &params);
    c.since = Instant::now();
    c.used = true;
    c.phase = Phase::Busy(job);
    if let Err(why) = sent {
        c.dead = Some(why);
    }
}

/// Waits on the latch, the postmaster and `watched` sockets (connection
/// index, event, socket) at most `timeout`; the indexes of the connections
/// whose socket is ready.
fn wait_events(watched: &[(usize, u32, c_int)], timeout: Duration) -> Vec<usize> {
    let n = watched.len() + 2;
    // SAFETY: a wait event set made, used and freed here, holding this
    // worker's own latch and sockets libpq keeps open meanwhile; `occurred`
    // has room for every event.
    unsafe {
        #[cfg(any(feature = "pg15", feature = "pg16"))]
        let set = pg_sys::CreateWaitEventSet(pg_sys::CurrentMemoryContext, n as c_int);
        #[cfg(not(any(feature = "pg15", feature = "pg16")))]
        let set = pg_sys::CreateWaitEventSet(std::ptr::null_mut(), n as c_int);
        pg_sys::AddWaitEventToSet(set, pg_sys::WL_LATCH_SET, pg_sys::PGINVALID_SOCKET, pg_sys::MyLatch, std::ptr::null_mut());
        pg_sys::AddWaitEventToSet(set, pg_sys::WL_EXIT_ON_PM_DEATH, pg_sys::PGINVALID_SOCKET, std::ptr::null_mut(), std::ptr::null_mut());
        let mut positions = Vec::with_capacity(watched.len());
        for &(i, event, socket) in watched {
            positions.push((pg_sys::AddWaitEventToSet(set, event, socket, std::ptr::null_mut(), std::ptr::null_mut()), i));
        }
        let mut occurred: Vec<pg_sys::WaitEvent> = (0..n).map(|_| std::mem::zeroed()).collect();
        let ms = timeout.as_millis().clamp(1, 1000) as std::ffi::c_long;
        let count = pg_sys::WaitEventSetWait(set, ms, occurred.as_mut_ptr(), n as c_int, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::FreeWaitEventSet(set);
        pg_sys::ResetLatch(pg_sys::MyLatch);
        occurred[..count.max(0) as usize]
            .iter()
            .filter_map(|e| positions.iter().find(|(pos, _)| *pos == e.pos).map(|(_, i)| *i))
            .collect()
    }
}
