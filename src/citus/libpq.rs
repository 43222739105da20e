//! Calls to other nodes of the cluster, over libpq: the one Citus itself
//! loaded (`citus.so` links it), found with `dlopen`; pg_idgen does not
//! link it. Each backend keeps a few connections, one per node it calls
//! (and per hop, below), as the calling role in the same database with
//! Citus's own `citus.node_conninfo`, within the server's count of
//! connections to each node (see [`pool`]). Every wait can be cancelled and
//! is bounded: for a free connection by [`pool::WAIT`], connecting by
//! [`CONNECT_TIMEOUT`], an answer by [`ANSWER_TIMEOUT`].

use std::cell::RefMut;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::{Duration, Instant};

use pgrx::prelude::*;

use super::metadata::{self, Addr};
use super::pool::{self, Slot};
use crate::backend::BackendLocal;
use crate::catalog;
use crate::errors::IdError;

/// What is asked of a node.
pub enum Request<'a> {
    /// `n` IDs of a logical shard (`next_shard_id`) or of a schema's
    /// (`next_schema_id`), by a statement prepared on the connection.
    Mint { schema: bool, value: &'a str, n: u32 },
    /// A statement of the hand-over, with text parameters.
    Sql { sql: String, params: Vec<String> },
}

/// Whom a call to another node runs as.
#[derive(Clone, Copy, PartialEq)]
pub enum As {
    /// The current role: minting, whose rights are checked where it is called.
    Caller,
    /// The extension's owner (a superuser, as Citus's own metadata sessions
    /// are): the hand-over, which no other role may run.
    Owner,
}

/// The `application_name` of the sessions pg_idgen opens on other nodes.
pub const FORWARDING: &str = "pg_idgen forwarding";

/// How many hops of forwarding this session is: 0 for a client's session,
/// 1 or 2 for a session another node opened (`pg_idgen.forwarded`, set at
/// connection start: a node whose library predates it refuses the session,
/// so calls never go round between versions).
pub fn hop() -> usize {
    pool::forwarded()
}

/// Has `addr` answer `request`, with the rows of text it answers;
/// reconnects once if the connection broke (a call that reached the node
/// but whose answer was lost only skips IDs, or repeats an idempotent step
/// of a hand-over). `what` names the node for an error.
pub fn call(addr: &Addr, request: &Request<'_>, role: As, function: &'static str, what: &dyn Fn() -> String) -> Vec<Vec<Option<String>>> {
    let mut rhythm = RHYTHM.get();
    rhythm.gap = rhythm.last_end.map(|t| t.elapsed());
    RHYTHM.set(rhythm);
    let info = conninfo(addr, role);
    let statements = statements();
    let mut retried = false;
    loop {
        let conn = connection(&info, user(role), &statements, addr, function, what);
        match run(conn, &info, request, &statements) {
            Ok(rows) => return rows,
            Err(Failure::Remote(e)) => e.raise(),
            Err(Failure::Broken(why)) => {
                drop_connection(&info);
                if retried {
                    IdError::CitusUnreachable { what: what(), node: addr.describe(), function, why }.raise()
                }
                retried = true;
            }
        }
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

/// How long connecting to another node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an answer may take once asked (the other node's own
/// `statement_timeout` for the call is the same).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The most connections a backend keeps open (one per node it calls).
const MAX_CONNECTIONS: usize = 4;

/// The role a call connects as.
fn user(role: As) -> pg_sys::Oid {
    match role {
        // SAFETY: reads the current role's OID; no preconditions.
        As::Caller => unsafe { pg_sys::GetUserId() },
        As::Owner => catalog::extension_owner(),
    }
}

/// How to reach `addr`: as `role`, in this database, one hop further than
/// this session, with what Citus itself connects with appended: its
/// `citus.node_conninfo` (TLS and the like) and the role's entry for that
/// node in `pg_dist_authinfo` (a password, a certificate), if any.
fn conninfo(addr: &Addr, role: As) -> String {
    let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    let user = user(role);
    // SAFETY: names of a role and of the current database, copied at once.
    let (user, db) = unsafe {
        let user = CStr::from_ptr(pg_sys::GetUserNameFromId(user, false)).to_string_lossy().into_owned();
        let db = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (user, CStr::from_ptr(db).to_string_lossy().into_owned())
    };
    // SAFETY: reads a GUC's current value (NULL without Citus), copied at once.
    let extra = unsafe {
        let v = pg_sys::GetConfigOption(c"citus.node_conninfo".as_ptr(), true, false);
        if v.is_null() { String::new() } else { CStr::from_ptr(v).to_string_lossy().into_owned() }
    };
    let authinfo = metadata::authinfo(addr, &user);
    // The other node ends the session after pool::IDLE unused, so idle
    // backends here (Citus keeps them for later shard queries) do not each
    // hold one of its connections, and their slots can be taken (see
    // `pool`); the next call reconnects, in a few milliseconds.
    format!(
        "host={} port={} dbname={} user={} application_name={} options='-c idle_session_timeout={} -c statement_timeout={} -c pg_idgen.forwarded={}' {extra} {authinfo}",
        quote(&addr.host),
        addr.port,
        quote(&db),
        quote(&user),
        quote(FORWARDING),
        pool::IDLE.as_millis(),
        ANSWER_TIMEOUT.as_millis(),
        (hop() + 1).min(2),
    )
}

enum Failure {
    /// The connection could not be made or broke, or its session ended.
    Broken(String),
    /// The node answered with an error: raised here as it was there.
    Remote(IdError),
}

/// Where a connection stands.
#[derive(Clone, Copy, PartialEq)]
enum State {
    /// Being opened, or its statements being prepared.
    Opening,
    /// Ready for a call, its slot not in use.
    Idle,
    /// Given out for a call, its slot in use; or a call was sent and its
    /// answer not read.
    Busy,
}

/// A connection to a node, and what it was opened with. Kept here from the
/// moment libpq makes it, so that an error or cancel raised while it is
/// opened or busy leaves it to be finished, not leaked; a connection found
/// in any state but `Idle` is finished and made again.
struct Connection {
    /// The conninfo (one connection per node and hop).
    info: String,
    /// The conninfo and the statements prepared on it.
    key: String,
    conn: *mut c_void,
    state: State,
    /// Its place in the server's count of connections to the node, when
    /// they are bounded.
    slot: Option<Slot>,
}

/// The backend's connections, the most recently used last.
static CONNECTIONS: BackendLocal<Vec<Connection>> = BackendLocal::new(Vec::new());

/// Closes a connection and gives its slot back.
fn finish(c: Connection) {
    // SAFETY: a connection libpq made and nobody else holds.
    unsafe { (libpq().finish)(c.conn) };
}

/// Closes the connections of `all` that `gone` picks.
fn close_where(mut all: RefMut<'_, Vec<Connection>>, gone: impl Fn(&Connection) -> bool) {
    let (gone, kept): (Vec<Connection>, _) = std::mem::take(&mut *all).into_iter().partition(gone);
    *all = kept;
    drop(all);
    gone.into_iter().for_each(finish);
}

/// How soon after its last call a session that calls again, and ends its
/// transaction after a call, counts as calling in a loop.
const LOOP_GAP: Duration = Duration::from_millis(20);

/// When this backend's last call to another node ended, and how long it had
/// not called before that call began.
#[derive(Clone, Copy)]
struct Rhythm {
    last_end: Option<Instant>,
    gap: Option<Duration>,
}

static RHYTHM: BackendLocal<Rhythm> = BackendLocal::new(Rhythm { last_end: None, gap: None });

/// Whether this backend runs shard queries for Citus (which names them so,
/// and tells them apart the same way).
fn citus_internal() -> bool {
    // SAFETY: a setting's variable, read on the backend's one thread.
    let name = unsafe { pg_sys::application_name };
    // SAFETY: a NUL-terminated string PostgreSQL owns, when set.
    !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes().starts_with(b"citus_internal gpid=")
}

/// Closes the idle connections to nodes that another backend waits to
/// connect to (see `pool`), at the end of each call and transaction, once
/// this backend has had its turn with them. At the end of a transaction it
/// keeps its turn only while it calls in a loop (its last call began within
/// LOOP_GAP of the one before and ended within LOOP_GAP): a session that
/// goes idle, or whose transaction went on after its call, gives its
/// connection up at once instead of holding it unused. Citus's shard
/// queries take no turns: each is one statement of a distributed one, whose
/// other shard queries may be the ones waiting. Never fails (it runs at
/// commit): a connection list in use is left as it is.
fn yield_to_waiters(transaction_end: bool) {
    let keep_turn = !citus_internal()
        && (!transaction_end || {
            let r = RHYTHM.get();
            r.gap.is_some_and(|g| g < LOOP_GAP) && r.last_end.is_some_and(|t| t.elapsed() < LOOP_GAP)
        });
    if let Some(all) = CONNECTIONS.try_borrow_mut() {
        close_where(all, |c| c.state == State::Idle && c.slot.as_ref().is_some_and(|s| s.must_yield(keep_turn)));
    }
}

/// Closes this backend's unused connections to node `key` (another role's,
/// or another hop's), before it waits for a place of its own there.
fn close_own(key: u64) {
    close_where(CONNECTIONS.borrow_mut(), |c| c.state == State::Idle && c.slot.as_ref().is_some_and(|s| s.node() == key));
}

fn drop_connection(info: &str) {
    close_where(CONNECTIONS.borrow_mut(), |c| c.info == info);
}

fn set_state(info: &str, state: State) {
    if let Some(c) = CONNECTIONS.borrow_mut().iter_mut().find(|c| c.info == info) {
        c.state = state;
        if let (State::Idle, Some(slot)) = (state, &c.slot) {
            slot.end_call();
        }
    }
}

/// Closes the connection for `info` unless [`Pending::done`] is called
/// first: a cancel or an error leaving a connection half opened, or with an
/// answer nobody will read, gives its slot back at once.
struct Pending<'a>(Option<&'a str>);

impl Pending<'_> {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(info) = self.0 {
            drop_connection(info);
        }
    }
}

/// The open connection for `info` with `statements` prepared, made (or
/// remade) if needed, its slot marked in use for a call (see `run`); every
/// wait in it can be cancelled.
fn connection(
    info: &str,
    user: pg_sys::Oid,
    statements: &[(&'static CStr, String, [pg_sys::Oid; 2])],
    addr: &Addr,
    function: &'static str,
    what: &dyn Fn() -> String,
) -> *mut c_void {
    let key = statements.iter().fold(info.to_owned(), |k, (_, sql, _)| k + "\n" + sql);
    {
        let mut all = CONNECTIONS.borrow_mut();
        if let Some(i) = all.iter().position(|c| c.info == info) {
            let c = &all[i];
            // SAFETY: reads the status of a live connection. A connection
            // whose slot another backend took is closed at the other end;
            // one opened while connections were not bounded is not kept
            // once they are.
            if c.key == key && c.state == State::Idle && unsafe { (libpq().status)(c.conn) } == CONNECTION_OK && c.slot.as_ref().map_or(!pool::bounded(), Slot::begin_call) {
                let mut c = all.remove(i);
                c.state = State::Busy;
                let conn = c.conn;
                all.push(c);
                return conn;
            }
        }
    }
    drop_connection(info);
    let oldest = {
        let mut all = CONNECTIONS.borrow_mut();
        (all.len() >= MAX_CONNECTIONS).then(|| all.remove(0))
    };
    oldest.into_iter().for_each(finish);
    register_callbacks_once();
    let slot = pool::bounded().then(|| pool::acquire(addr, user, function, &close_own));
    let l = libpq();
    let fail = |f: Failure| -> ! {
        drop_connection(info);
        match f {
            Failure::Broken(why) => IdError::CitusUnreachable { what: what(), node: addr.describe(), function, why }.raise(),
            Failure::Remote(e) => e.raise(),
        }
    };
    let cinfo = CString::new(info).unwrap_or_default();
    // SAFETY: libpq's non-blocking connect on a connection kept in
    // CONNECTIONS from the start (finished by drop_connection on every path
    // that does not keep it); each prepare's results are cleared by round_trip.
    unsafe {
        let conn = (l.connect_start)(cinfo.as_ptr());
        if conn.is_null() {
            drop(slot);
            fail(Failure::Broken("out of memory".into()))
        }
        CONNECTIONS.borrow_mut().push(Connection { info: info.to_owned(), key, conn, state: State::Opening, slot });
        let pending = Pending(Some(info));
        if let Err(f) = connect(l, conn) {
            fail(f)
        }
        for (name, sql, param_types) in statements {
            let sql = CString::new(sql.as_str()).unwrap_or_default();
            let send = || (l.send_prepare)(conn, name.as_ptr(), sql.as_ptr(), 2, param_types.as_ptr());
            let prepared = round_trip(l, conn, send, |res| match (l.result_status)(res) {
                PGRES_COMMAND_OK => Ok(()),
                _ => Err(failure(l, conn, res)),
            });
            if let Err(f) = prepared {
                fail(f)
            }
        }
        pending.done();
        set_state(info, State::Busy);
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
            if left.is_zero() || !wait(l, conn, writing, left) {
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
unsafe fn wait(l: &Libpq, conn: *mut c_void, writing: bool, timeout: Duration) -> bool {
    let socket_event = if writing { pg_sys::WL_SOCKET_WRITEABLE } else { pg_sys::WL_SOCKET_READABLE };
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH | socket_event | pg_sys::WL_TIMEOUT) as c_int;
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as std::ffi::c_long;
    // SAFETY: the caller's; waits on our own latch and the connection's socket.
    let happened = unsafe { pg_sys::WaitLatchOrSocket(pg_sys::MyLatch, events, (l.socket)(conn), ms, pg_sys::PG_WAIT_EXTENSION) };
    // SAFETY: resets our own latch before looking for interrupts.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    pg_sys::check_for_interrupts!();
    happened & pg_sys::WL_TIMEOUT as c_int == 0
}

/// Sends a command with `send` and reads every result it brings with
/// `read` (the first one counts), waiting on the socket and the latch, at
/// most ANSWER_TIMEOUT.
///
/// # Safety
/// `conn` is a live connection with nothing in flight; `send` sends on it.
unsafe fn round_trip<T>(
    l: &Libpq,
    conn: *mut c_void,
    send: impl FnOnce() -> c_int,
    read: impl Fn(*mut c_void) -> Result<T, Failure>,
) -> Result<T, Failure> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
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
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::Broken(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs())));
            }
            wait(l, conn, false, left);
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

fn register_callbacks_once() {
    static REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
    if !REGISTERED.get() {
        REGISTERED.set(true);
        // SAFETY: registers callbacks that only close our connections.
        unsafe {
            pg_sys::on_proc_exit(Some(close_at_exit), pg_sys::Datum::from(0));
            pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
        }
    }
}

unsafe extern "C-unwind" fn at_transaction_end(event: pg_sys::XactEvent::Type, _arg: *mut c_void) {
    use pg_sys::XactEvent::*;
    if matches!(event, XACT_EVENT_COMMIT | XACT_EVENT_ABORT | XACT_EVENT_PREPARE | XACT_EVENT_PARALLEL_COMMIT | XACT_EVENT_PARALLEL_ABORT) {
        yield_to_waiters(true);
    }
}

unsafe extern "C-unwind" fn close_at_exit(_code: c_int, _arg: pg_sys::Datum) {
    let all = std::mem::take(&mut *CONNECTIONS.borrow_mut());
    all.into_iter().for_each(finish);
}

fn message(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string libpq owns, copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim_end().to_string()
}

/// Runs a request on a connection from `connection` and returns the rows it answers,
/// as text; a mint request must answer exactly the IDs it asked for.
fn run(
    conn: *mut c_void,
    info: &str,
    request: &Request<'_>,
    statements: &[(&'static CStr, String, [pg_sys::Oid; 2])],
) -> Result<Vec<Vec<Option<String>>>, Failure> {
    let l = libpq();
    let (sql, params, prepared, expect) = match request {
        Request::Mint { schema, value, n } => {
            let name = statements[*schema as usize].0;
            (name.to_owned(), vec![value.to_string(), n.to_string()], true, Some(*n))
        }
        Request::Sql { sql, params } => (CString::new(sql.as_str()).unwrap_or_default(), params.clone(), false, None),
    };
    // SQL text and parameters never hold a NUL byte.
    let params: Vec<CString> = params.into_iter().map(|p| CString::new(p).unwrap_or_default()).collect();
    let values: Vec<*const c_char> = params.iter().map(|p| p.as_ptr()).collect();
    let n = values.len() as c_int;
    let pending = Pending(Some(info));
    // SAFETY: a connection from connection(), and parameter arrays
    // that outlive the call; rows and columns are read below their counts.
    let outcome = unsafe {
        round_trip(
            l,
            conn,
            || match prepared {
                true => (l.send_query_prepared)(conn, sql.as_ptr(), n, values.as_ptr(), std::ptr::null(), std::ptr::null(), 0),
                false => (l.send_query_params)(conn, sql.as_ptr(), n, std::ptr::null(), values.as_ptr(), std::ptr::null(), std::ptr::null(), 0),
            },
            |res| match (l.result_status)(res) {
                PGRES_TUPLES_OK => {
                    let (rows, columns) = ((l.ntuples)(res), (l.nfields)(res));
                    if expect.is_some_and(|n| n as c_int != rows) {
                        return Err(Failure::Remote(IdError::Internal(format!("another node returned {rows} IDs of {}", expect.unwrap_or(0)))));
                    }
                    Ok((0..rows)
                        .map(|r| {
                            (0..columns)
                                .map(|f| ((l.get_is_null)(res, r, f) == 0).then(|| message((l.get_value)(res, r, f))))
                                .collect()
                        })
                        .collect())
                }
                _ => Err(failure(l, conn, res)),
            },
        )
    };
    pending.done();
    set_state(info, State::Idle);
    RHYTHM.set(Rhythm { last_end: Some(Instant::now()), ..RHYTHM.get() });
    yield_to_waiters(false);
    outcome
}

/// What an error result means: the session ended (the connection broke, or
/// the node ended the session with a FATAL error: terminated, idle too
/// long, shutting down), so the command did not run; or the node raised an
/// error, to be raised here as it was there.
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
    #[allow(clippy::type_complexity)]
    send_query_params: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        c_int,
        *const pg_sys::Oid,
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
    nfields: unsafe extern "C" fn(*const c_void) -> c_int,
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
                send_query_params: sym!(c"PQsendQueryParams"),
                consume_input: sym!(c"PQconsumeInput"),
                is_busy: sym!(c"PQisBusy"),
                get_result: sym!(c"PQgetResult"),
                result_status: sym!(c"PQresultStatus"),
                ntuples: sym!(c"PQntuples"),
                nfields: sym!(c"PQnfields"),
                get_is_null: sym!(c"PQgetisnull"),
                get_value: sym!(c"PQgetvalue"),
                result_error_field: sym!(c"PQresultErrorField"),
                clear: sym!(c"PQclear"),
            }
        }
    })
}
