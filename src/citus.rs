//! Citus: one minter for every logical shard of a cluster.
//!
//! Citus evaluates a `DEFAULT next_shard_id(...)` on whichever node a
//! statement enters through, and for `INSERT ... SELECT` or `COPY` on every
//! worker holding a shard. If each node minted with its own generators, two
//! nodes would mint the same shard in the same millisecond with the same
//! sequence numbers. So on a Citus cluster the coordinator (node group 0)
//! mints every ID of every logical shard: a worker sends each
//! `next_shard_id(shard)` and `next_schema_id(schema)` to it, over one
//! connection per backend, as the calling role, and returns what it answers.
//! The coordinator's generators, mark files and fleet ownership then keep
//! the guarantees they keep on a single server (no duplicate, every ID of a
//! shard above the ones before it), whichever node the call came through and
//! wherever the shard's rows live, so shard moves, rebalancing and added or
//! removed workers change nothing. The schema registry only matters on the
//! coordinator. The cost: one round trip to the coordinator per statement
//! that mints one ID on a worker; a statement minting many rows there fetches
//! them in blocks (see [`Block`]). UUIDv7 is minted locally on every node
//! (74 random bits).
//!
//! Without Citus in `shared_preload_libraries` nothing here runs; with it, a
//! database without the citus extension, or whose local group is 0, mints
//! locally.
//!
//! libpq is the one Citus itself loaded (`citus.so` links it), found with
//! `dlopen`; pg_idgen does not link it.

use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::catalog;
use crate::core::layout::Shard;
use crate::errors::IdError;

/// Whether Citus is loaded in this server (set once, at our preload).
static PRELOADED: AtomicBool = AtomicBool::new(false);

/// At preload: notes whether Citus is loaded. Citus insists on being loaded
/// before any library that sets a planner hook, as pg_idgen does, so its
/// settings exist by now however `shared_preload_libraries` spells it
/// (`citus`, `$libdir/citus`, `citus.so`). A `citus.*` placeholder set
/// without Citus only costs a catalog check per cache generation.
pub fn init() {
    // SAFETY: looks a setting up by name; no string is kept.
    let citus = unsafe { !pg_sys::GetConfigOption(c"citus.node_conninfo".as_ptr(), true, false).is_null() };
    PRELOADED.store(citus, Ordering::Relaxed);
    if citus {
        // SAFETY: chains the previous hook, in the postmaster before any backend starts.
        unsafe {
            PREV_ANALYZE = pg_sys::post_parse_analyze_hook;
            pg_sys::post_parse_analyze_hook = Some(statement_analyzed);
        }
    }
}

static mut PREV_ANALYZE: pg_sys::post_parse_analyze_hook_type = None;

/// Statements this backend has parsed and analyzed: every statement of a
/// query string is, before it runs (utility statements too, FETCH and CALL
/// among them), as are a function's statements when first prepared.
static ANALYZED: AtomicU64 = AtomicU64::new(0);

/// The hook, installed only with Citus: counts, then calls the next hook.
/// Not `#[pg_guard]`: it holds nothing with a destructor, so an error of
/// the next hook leaves through it to PostgreSQL untouched.
unsafe extern "C-unwind" fn statement_analyzed(pstate: *mut pg_sys::ParseState, query: *mut pg_sys::Query, jstate: *mut pg_sys::JumbleState) {
    ANALYZED.fetch_add(1, Ordering::Relaxed);
    // SAFETY: PREV_ANALYZE is set once, at preload; its arguments are ours.
    if let Some(prev) = unsafe { PREV_ANALYZE } {
        unsafe { prev(pstate, query, jstate) }
    }
}

/// What a worker asks the coordinator for.
pub enum Call<'a> {
    Shard(Shard),
    Schema(&'a str),
}

impl Call<'_> {
    fn key(&self) -> Key {
        match self {
            Call::Shard(shard) => Key::Shard(shard.index()),
            Call::Schema(schema) => Key::Schema(schema.to_string()),
        }
    }
}

#[derive(Clone, PartialEq)]
enum Key {
    Shard(usize),
    Schema(String),
}

/// The most IDs one round trip fetches: a millisecond's worth of one shard.
const MAX_BLOCK: u32 = 1024;

/// The most shards and schemas one statement keeps blocks for; past it the
/// blocks start over (bounding a backend's memory).
const MAX_BLOCKS: usize = 64;

/// IDs the coordinator minted for one shard or schema in the current
/// statement, not yet handed out. Each fetch takes twice as many as the
/// last, from 1 up to [`MAX_BLOCK`]: a statement that mints one row pays one
/// round trip and skips no ID; one that mints 20,000 pays 29. Every ID of a
/// block was minted after the statement began, so it is above every ID of
/// its shard acknowledged before; those left when the statement ends are
/// skipped, never handed out. A statement's IDs of one shard rise in the
/// order it takes them, whichever of its calls takes them; IDs of
/// statements running at once interleave.
struct Block {
    key: Key,
    ids: VecDeque<i64>,
    next: u32,
}

/// The statement the blocks belong to: the client's command (by its start
/// time, a new one at every protocol message), the statements analyzed
/// before it (a new one for each statement of a query string: they share a
/// start time), and the current role (a block fetched as one role is not
/// handed to another). A statement that ends, fails or is followed by
/// another leaves its blocks behind, also where a call outlives it (a
/// PL/pgSQL expression's lives as long as its transaction, a cursor's until
/// it is closed).
type Statement = (pg_sys::TimestampTz, u64, pg_sys::Oid);

static BLOCKS: BackendLocal<(Option<Statement>, Vec<Block>)> = BackendLocal::new((None, Vec::new()));

/// The ID the coordinator minted for `call`, when this node is a Citus
/// worker; None when this node mints.
#[inline]
pub fn mint_elsewhere(call: Call<'_>, function: &'static str) -> Option<i64> {
    if !PRELOADED.load(Ordering::Relaxed) {
        return None;
    }
    let coordinator = coordinator()?;
    if forwarding_session() {
        IdError::CitusForwardedToWorker(function).raise()
    }
    crate::mark::check_writable(function);
    let key = call.key();
    // SAFETY: reads the current command's start time and the current role.
    let statement = unsafe { (pg_sys::GetCurrentStatementStartTimestamp(), ANALYZED.load(Ordering::Relaxed), pg_sys::GetUserId()) };
    let n = {
        let mut blocks = BLOCKS.borrow_mut();
        let (of, blocks) = &mut *blocks;
        if *of != Some(statement) || blocks.len() >= MAX_BLOCKS && !blocks.iter().any(|b| b.key == key) {
            *of = Some(statement);
            blocks.clear();
        }
        match blocks.iter_mut().find(|b| b.key == key) {
            Some(b) => match b.ids.pop_front() {
                Some(id) => return Some(id),
                None => b.next,
            },
            None => {
                blocks.push(Block { key: key.clone(), ids: VecDeque::new(), next: 1 });
                1
            }
        }
    };
    // No borrow is held across the round trip, which may raise.
    let mut ids = forward(&coordinator, &call, n, function);
    let first = ids.pop_front();
    if let Some(b) = BLOCKS.borrow_mut().1.iter_mut().find(|b| b.key == key) {
        b.ids = ids;
        b.next = (n * 2).min(MAX_BLOCK);
    }
    first.or_else(|| IdError::Internal("the coordinator returned no ID".into()).raise())
}

/// Refuses, on a Citus worker, what only the coordinator's state can hold.
pub fn refuse_on_worker(function: &'static str) {
    if PRELOADED.load(Ordering::Relaxed) && coordinator().is_some() {
        IdError::CitusWorker(function).raise()
    }
}

/// The `application_name` of the sessions workers open on the coordinator.
const FORWARDING: &str = "pg_idgen forwarding";

/// Whether this session is one a worker opened to forward a call: if this
/// node forwards too, a worker's metadata names as coordinator a node that
/// is not one, and forwarding again would chain sessions without end.
fn forwarding_session() -> bool {
    // SAFETY: reads the session's application_name, copied at once.
    let name = unsafe { pg_sys::application_name };
    !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == FORWARDING.as_bytes()
}

#[derive(Clone, PartialEq)]
struct Coordinator {
    host: String,
    port: i32,
}

/// The coordinator, if this database is a Citus worker's: read from Citus's
/// metadata, again after any invalidation (a node added, moved or removed).
fn coordinator() -> Option<Coordinator> {
    static CACHE: BackendLocal<Option<(u64, Option<Coordinator>)>> = BackendLocal::new(None);
    let generation = catalog::generation();
    if let Some((seen, c)) = &*CACHE.borrow_mut() {
        if *seen == generation {
            return c.clone();
        }
    }
    let c = look_up_coordinator();
    *CACHE.borrow_mut() = Some((generation, c.clone()));
    c
}

fn look_up_coordinator() -> Option<Coordinator> {
    if !catalog::extension_installed(c"citus") {
        return None;
    }
    // As of now: a session whose snapshot predates this node's joining the
    // cluster must still see that it is a worker.
    let rows = catalog::query_text_rows_now(
        c"SELECT n.nodename::text, n.nodeport
            FROM pg_catalog.pg_dist_local_group l
            LEFT JOIN pg_catalog.pg_dist_node n ON n.groupid = 0 AND n.noderole = 'primary'
           WHERE l.groupid <> 0",
    );
    match rows.into_iter().next().as_deref() {
        None => None,
        Some([Some(host), Some(port)]) => Some(Coordinator { host: host.clone(), port: port.parse().unwrap_or_default() }),
        Some(_) => IdError::CitusNoCoordinator.raise(),
    }
}

/// The statements each connection prepares: name, SQL, parameter types.
/// Each mints `$2` IDs for `$1`, in order, with the function the caller
/// called (so the same grants apply).
fn statements() -> [(&'static CStr, String, [pg_sys::Oid; 2]); 2] {
    let select = |f: &str| format!("SELECT {}($1) FROM pg_catalog.generate_series(1, $2)", catalog::qualified(f));
    [
        (c"pg_idgen_shard", select("next_shard_id"), [pg_sys::INT4OID, pg_sys::INT4OID]),
        (c"pg_idgen_schema", select("next_schema_id"), [pg_sys::TEXTOID, pg_sys::INT4OID]),
    ]
}

/// Has the coordinator mint `n` IDs for the call; reconnects once if the
/// connection broke (a call that reached the coordinator but whose answer
/// was lost only skips IDs).
fn forward(coordinator: &Coordinator, call: &Call<'_>, n: u32, function: &'static str) -> VecDeque<i64> {
    let statements = statements();
    let (statement, value) = match call {
        Call::Shard(shard) => (statements[0].0, shard.index().to_string()),
        Call::Schema(schema) => (statements[1].0, schema.to_string()),
    };
    // SQL text never holds a NUL byte.
    let value = CString::new(value).unwrap_or_default();
    let count = CString::new(n.to_string()).unwrap_or_default();
    let info = conninfo(coordinator);
    let mut retried = false;
    loop {
        match run(connection(&info, &statements, coordinator, function), statement, [&value, &count], n) {
            Ok(id) => return id,
            Err(Failure::Remote(e)) => e.raise(),
            Err(Failure::Broken(why)) => {
                drop_connection();
                if retried {
                    IdError::CitusUnreachable { node: coordinator.describe(), function, why }.raise()
                }
                retried = true;
            }
        }
    }
}

impl Coordinator {
    fn describe(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// How long the coordinator keeps a forwarding session that is not used
/// (reconnecting costs a few milliseconds).
const IDLE_MS: u32 = 10_000;

/// How long connecting to the coordinator may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How to reach the coordinator: as the current role, in this database,
/// with Citus's own `citus.node_conninfo` (TLS and the like) appended.
fn conninfo(c: &Coordinator) -> String {
    let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    // SAFETY: names of the current role and database, copied at once.
    let (user, db) = unsafe {
        let user = CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false)).to_string_lossy().into_owned();
        let db = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (user, CStr::from_ptr(db).to_string_lossy().into_owned())
    };
    // SAFETY: reads a GUC's current value (NULL without Citus), copied at once.
    let extra = unsafe {
        let v = pg_sys::GetConfigOption(c"citus.node_conninfo".as_ptr(), true, false);
        if v.is_null() { String::new() } else { CStr::from_ptr(v).to_string_lossy().into_owned() }
    };
    // The coordinator ends the session after 10 s unused, so idle
    // worker backends (Citus keeps them for later shard queries) do not each
    // hold one of its connections; the next call reconnects.
    format!(
        "host={} port={} dbname={} user={} application_name={} options='-c idle_session_timeout={IDLE_MS}' {extra}",
        quote(&c.host),
        c.port,
        quote(&db),
        quote(&user),
        quote(FORWARDING),
    )
}

enum Failure {
    /// The connection could not be made or broke, or its session ended.
    Broken(String),
    /// The coordinator answered with an error: raised here as it was there.
    Remote(IdError),
}

/// Where the backend's connection to the coordinator stands.
#[derive(Clone, Copy, PartialEq)]
enum State {
    /// Being opened, or its statements being prepared.
    Opening,
    /// Ready for a call.
    Idle,
    /// A call was sent and its answer not read.
    Busy,
}

/// The backend's connection to the coordinator, and what it was opened with.
/// Kept here from the moment libpq makes it, so that an error or cancel
/// raised while it is opened or busy leaves it to be finished, not leaked; a
/// connection found in any state but `Idle` is finished and made again.
struct Connection {
    /// The conninfo and the statements prepared on it.
    key: String,
    conn: *mut c_void,
    state: State,
}

static CONNECTION: BackendLocal<Option<Connection>> = BackendLocal::new(None);

fn drop_connection() {
    if let Some(c) = CONNECTION.borrow_mut().take() {
        // SAFETY: a connection libpq made and nobody else holds.
        unsafe { (libpq().finish)(c.conn) };
    }
}

fn set_state(state: State) {
    if let Some(c) = CONNECTION.borrow_mut().as_mut() {
        c.state = state;
    }
}

/// The open connection for `info` with `statements` prepared, made (or
/// remade) if needed; every wait in it can be cancelled.
fn connection(
    info: &str,
    statements: &[(&'static CStr, String, [pg_sys::Oid; 2])],
    coordinator: &Coordinator,
    function: &'static str,
) -> *mut c_void {
    let key = statements.iter().fold(info.to_owned(), |k, (_, sql, _)| k + "\n" + sql);
    {
        let c = CONNECTION.borrow_mut();
        if let Some(c) = c.as_ref() {
            // SAFETY: reads the status of a live connection.
            if c.key == key && c.state == State::Idle && unsafe { (libpq().status)(c.conn) } == CONNECTION_OK {
                return c.conn;
            }
        }
    }
    drop_connection();
    register_exit_once();
    let l = libpq();
    let fail = |f: Failure| -> ! {
        drop_connection();
        match f {
            Failure::Broken(why) => IdError::CitusUnreachable { node: coordinator.describe(), function, why }.raise(),
            Failure::Remote(e) => e.raise(),
        }
    };
    let cinfo = CString::new(info).unwrap_or_default();
    // SAFETY: libpq's non-blocking connect on a connection kept in
    // CONNECTION from the start (finished by drop_connection on every path
    // that does not keep it); each prepare's results are cleared by round_trip.
    unsafe {
        let conn = (l.connect_start)(cinfo.as_ptr());
        if conn.is_null() {
            fail(Failure::Broken("out of memory".into()))
        }
        *CONNECTION.borrow_mut() = Some(Connection { key, conn, state: State::Opening });
        if let Err(f) = connect(l, conn) {
            fail(f)
        }
        for (name, sql, param_types) in statements {
            let sql = CString::new(sql.as_str()).unwrap_or_default();
            let send = || (l.send_prepare)(conn, name.as_ptr(), sql.as_ptr(), 2, param_types.as_ptr());
            let prepared = round_trip(l, conn, send, |res| {
                match (l.result_status)(res) {
                    PGRES_COMMAND_OK => Ok(()),
                    _ => Err(failure(l, conn, res)),
                }
            });
            if let Err(f) = prepared {
                fail(f)
            }
        }
        set_state(State::Idle);
        conn
    }
}

/// Drives libpq's connection sequence to its end or to CONNECT_TIMEOUT.
///
/// # Safety
/// `conn` is a live connection from PQconnectStart.
unsafe fn connect(l: &Libpq, conn: *mut c_void) -> Result<(), Failure> {
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    // SAFETY: the caller's.
    unsafe {
        if (l.status)(conn) == CONNECTION_BAD {
            return Err(Failure::Broken(message((l.error_message)(conn))));
        }
        // libpq's protocol: wait as if the last poll asked for writing.
        let mut writing = true;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !wait(l, conn, writing, Some(left)) {
                return Err(Failure::Broken(format!("timeout expired after {} s", CONNECT_TIMEOUT.as_secs())));
            }
            match (l.connect_poll)(conn) {
                PGRES_POLLING_OK => return Ok(()),
                PGRES_POLLING_READING => writing = false,
                PGRES_POLLING_WRITING => writing = true,
                _ => return Err(Failure::Broken(message((l.error_message)(conn)))),
            }
        }
    }
}

/// Waits until `conn`'s socket is readable (or writable), or `timeout`
/// passes (false), on the process latch too, so that a cancel or shutdown
/// is raised here.
///
/// # Safety
/// `conn` is a live connection.
unsafe fn wait(l: &Libpq, conn: *mut c_void, writing: bool, timeout: Option<Duration>) -> bool {
    let socket_event = if writing { pg_sys::WL_SOCKET_WRITEABLE } else { pg_sys::WL_SOCKET_READABLE };
    let timeout_event = if timeout.is_some() { pg_sys::WL_TIMEOUT } else { 0 };
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH | socket_event | timeout_event) as c_int;
    let ms = timeout.map_or(-1, |t| t.as_millis().clamp(1, i32::MAX as u128) as std::ffi::c_long);
    // SAFETY: the caller's; waits on our own latch and the connection's socket.
    let happened = unsafe { pg_sys::WaitLatchOrSocket(pg_sys::MyLatch, events, (l.socket)(conn), ms, pg_sys::PG_WAIT_EXTENSION) };
    // SAFETY: resets our own latch before looking for interrupts.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    pg_sys::check_for_interrupts!();
    happened & pg_sys::WL_TIMEOUT as c_int == 0
}

/// Sends a command with `send` and reads every result it brings with
/// `read` (the first one counts), waiting on the socket and the latch.
///
/// # Safety
/// `conn` is a live connection with nothing in flight; `send` sends on it.
unsafe fn round_trip<T>(
    l: &Libpq,
    conn: *mut c_void,
    send: impl FnOnce() -> c_int,
    read: impl Fn(*mut c_void) -> Result<T, Failure>,
) -> Result<T, Failure> {
    // SAFETY: the caller's; every result is cleared.
    unsafe {
        if send() == 0 {
            return Err(Failure::Broken(message((l.error_message)(conn))));
        }
        loop {
            if (l.consume_input)(conn) == 0 {
                return Err(Failure::Broken(message((l.error_message)(conn))));
            }
            if (l.is_busy)(conn) == 0 {
                break;
            }
            wait(l, conn, false, None);
        }
        let mut outcome = None;
        loop {
            let res = (l.get_result)(conn);
            if res.is_null() {
                break;
            }
            if outcome.is_none() {
                outcome = Some(read(res));
            }
            (l.clear)(res);
        }
        outcome.unwrap_or_else(|| Err(Failure::Broken("no answer".into())))
    }
}

fn register_exit_once() {
    static REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
    if !REGISTERED.get() {
        REGISTERED.set(true);
        // SAFETY: registers a callback that only closes our connection.
        unsafe { pg_sys::on_proc_exit(Some(close_at_exit), pg_sys::Datum::from(0)) };
    }
}

unsafe extern "C-unwind" fn close_at_exit(_code: c_int, _arg: pg_sys::Datum) {
    drop_connection();
}

fn message(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string libpq owns, copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim_end().to_string()
}

/// Runs a prepared statement on an idle connection and parses the `n`
/// bigints it answers, in their order.
fn run(conn: *mut c_void, statement: &CStr, params: [&CStr; 2], n: u32) -> Result<VecDeque<i64>, Failure> {
    let l = libpq();
    let values = params.map(CStr::as_ptr);
    set_state(State::Busy);
    // SAFETY: an idle connection from connection(), and an array of two
    // parameters that outlives the call; rows are read below ntuples.
    let outcome = unsafe {
        round_trip(
            l,
            conn,
            || (l.send_query_prepared)(conn, statement.as_ptr(), 2, values.as_ptr(), std::ptr::null(), std::ptr::null(), 0),
            |res| match (l.result_status)(res) {
                PGRES_TUPLES_OK if (l.ntuples)(res) == n as c_int => (0..n as c_int)
                    .map(|row| match (l.get_is_null)(res, row, 0) {
                        0 => message((l.get_value)(res, row, 0)).parse().map_err(|_| Failure::Broken("an answer that is not a bigint".into())),
                        _ => Err(Failure::Remote(IdError::Internal("the coordinator returned a null ID".into()))),
                    })
                    .collect(),
                PGRES_TUPLES_OK => Err(Failure::Remote(IdError::Internal(format!("the coordinator returned {} IDs of {n}", (l.ntuples)(res))))),
                _ => Err(failure(l, conn, res)),
            },
        )
    };
    set_state(State::Idle);
    outcome
}

/// What an error result means: the session ended (the connection broke, or
/// the coordinator ended the session with a FATAL error: terminated, idle
/// too long, shutting down), so the command did not run; or the coordinator
/// raised an error, to be raised here as it was there.
///
/// # Safety
/// `res` is a live result of `conn`.
unsafe fn failure(l: &Libpq, conn: *mut c_void, res: *mut c_void) -> Failure {
    let field = |f: u8| {
        // SAFETY: the caller's.
        let p = unsafe { (l.result_error_field)(res, f as c_int) };
        (!p.is_null()).then(|| message(p))
    };
    // SAFETY: the caller's.
    if unsafe { (l.status)(conn) } != CONNECTION_OK || matches!(field(b'V').as_deref(), Some("FATAL" | "PANIC")) {
        let why = field(b'M');
        // SAFETY: the caller's.
        return Failure::Broken(why.unwrap_or_else(|| message(unsafe { (l.error_message)(conn) })));
    }
    Failure::Remote(IdError::Relayed {
        sqlstate: field(b'C').unwrap_or_else(|| "XX000".into()),
        message: field(b'M').unwrap_or_default(),
        detail: field(b'D'),
        hint: field(b'H'),
    })
}

const CONNECTION_OK: c_int = 0;
const CONNECTION_BAD: c_int = 1;
const PGRES_POLLING_READING: c_int = 1;
const PGRES_POLLING_WRITING: c_int = 2;
const PGRES_POLLING_OK: c_int = 3;
const PGRES_COMMAND_OK: c_int = 1;
const PGRES_TUPLES_OK: c_int = 2;

/// The libpq functions we call, resolved once per process.
struct Libpq {
    connect_start: unsafe extern "C" fn(*const c_char) -> *mut c_void,
    connect_poll: unsafe extern "C" fn(*mut c_void) -> c_int,
    status: unsafe extern "C" fn(*const c_void) -> c_int,
    error_message: unsafe extern "C" fn(*const c_void) -> *const c_char,
    finish: unsafe extern "C" fn(*mut c_void),
    socket: unsafe extern "C" fn(*const c_void) -> c_int,
    send_prepare: unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char, c_int, *const pg_sys::Oid) -> c_int,
    #[allow(clippy::type_complexity)]
    send_query_prepared: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        c_int,
        *const *const c_char,
        *const c_int,
        *const c_int,
        c_int,
    ) -> c_int,
    consume_input: unsafe extern "C" fn(*mut c_void) -> c_int,
    is_busy: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_result: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    result_status: unsafe extern "C" fn(*const c_void) -> c_int,
    ntuples: unsafe extern "C" fn(*const c_void) -> c_int,
    get_is_null: unsafe extern "C" fn(*const c_void, c_int, c_int) -> c_int,
    get_value: unsafe extern "C" fn(*const c_void, c_int, c_int) -> *const c_char,
    result_error_field: unsafe extern "C" fn(*const c_void, c_int) -> *const c_char,
    clear: unsafe extern "C" fn(*mut c_void),
}

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

// Each transmute's target is the type of the field it fills.
#[allow(clippy::missing_transmute_annotations)]
fn libpq() -> &'static Libpq {
    static LIBPQ: once_cell::sync::OnceCell<Libpq> = once_cell::sync::OnceCell::new();
    LIBPQ.get_or_init(|| {
        const RTLD_NOW: c_int = 2;
        // SAFETY: dlopen of the libpq Citus already loaded (same soname), and
        // each symbol transmuted to the type libpq-fe.h declares for it.
        unsafe {
            let handle = dlopen(c"libpq.so.5".as_ptr(), RTLD_NOW);
            if handle.is_null() {
                IdError::Internal("libpq.so.5 cannot be loaded".into()).raise()
            }
            macro_rules! sym {
                ($name:literal) => {{
                    let p = dlsym(handle, $name.as_ptr());
                    if p.is_null() {
                        IdError::Internal(format!("libpq has no {:?}", $name)).raise()
                    }
                    std::mem::transmute::<*mut c_void, _>(p)
                }};
            }
            Libpq {
                connect_start: sym!(c"PQconnectStart"),
                connect_poll: sym!(c"PQconnectPoll"),
                status: sym!(c"PQstatus"),
                error_message: sym!(c"PQerrorMessage"),
                finish: sym!(c"PQfinish"),
                socket: sym!(c"PQsocket"),
                send_prepare: sym!(c"PQsendPrepare"),
                send_query_prepared: sym!(c"PQsendQueryPrepared"),
                consume_input: sym!(c"PQconsumeInput"),
                is_busy: sym!(c"PQisBusy"),
                get_result: sym!(c"PQgetResult"),
                result_status: sym!(c"PQresultStatus"),
                ntuples: sym!(c"PQntuples"),
                get_is_null: sym!(c"PQgetisnull"),
                get_value: sym!(c"PQgetvalue"),
                result_error_field: sym!(c"PQresultErrorField"),
                clear: sym!(c"PQclear"),
            }
        }
    })
}
