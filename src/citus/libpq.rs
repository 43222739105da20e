//! Calls to other nodes of the cluster, over libpq: the one Citus loaded
//! (`citus.so` links it), found with `dlopen`. Not linked: a preloaded
//! library linking it would choose every process's libpq at the server's
//! start, the walreceiver's too (see CONTRIBUTING). A session calls another
//! node over a connection of its own, as the extension's owner (a superuser,
//! as Citus's own metadata sessions are), in the same database, with
//! `citus.node_conninfo` and the owner's entry in `pg_dist_authinfo`: no
//! application role needs a password on another node. Minting and
//! hand-overs go the same way ([`mint`], [`call`]).
//!
//! The server's sessions together keep at most
//! `pg_idgen.citus_max_connections_per_node` connections to any one node,
//! counted in shared memory as Citus counts its own (see `core::pool`): a
//! call waits its turn at most [`WAIT`] (53300), and a session whose call
//! ends while another waits for the node, once it had its turn a while,
//! closes its connection; otherwise it keeps it until the other node ends
//! it, idle for [`IDLE`]. Every wait can be cancelled and is bounded: a
//! turn by [`WAIT`], connecting by [`CONNECT_TIMEOUT`], an answer by [`ANSWER_TIMEOUT`].

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::time::{Duration, Instant};

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PGRXSharedMemory};

use super::admission;
use super::metadata::{self, Addr};
use crate::backend::BackendLocal;
use crate::catalog;
use crate::clock;
use crate::core::pool::{Pool, Turn};
use crate::errors::IdError;

/// The `application_name` of the sessions pg_idgen opens on other nodes.
pub const FORWARDING: &str = "pg_idgen forwarding";

/// How long connecting to another node (and preparing statements there) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an answer may take once asked (the other node's own
/// `statement_timeout` for the call is the same).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// How long another node keeps a session of ours unused
/// (`idle_session_timeout`), so that idle sessions here do not hold its
/// connections, nor turns other sessions wait for: a session calling less
/// often pays for a connection at each call (milliseconds).
pub const IDLE: Duration = Duration::from_millis(250);

/// How much longer than [`IDLE`] a connection is counted: the other node's
/// session takes a moment to end.
const MARGIN: Duration = Duration::from_millis(250);

/// How long a call waits for a turn at a node before it fails with 53300.
pub const WAIT: Duration = Duration::from_secs(10);

/// The most connections a session keeps open (one per node).
const MAX_CONNECTIONS: usize = 4;

/// The most connections this server's sessions keep to one other node.
static MAX_PER_NODE: GucSetting<i32> = GucSetting::<i32>::new(16);

/// Defines `pg_idgen.citus_max_connections_per_node`, preloaded or not.
pub fn register_settings() {
    GucRegistry::define_int_guc(
        c"pg_idgen.citus_max_connections_per_node",
        c"How many connections this server's sessions keep open to any one other Citus node to mint there, all together.",
        c"A call waits its turn at most 10 s; a session that had its turn 250 ms closes its connection at the end of a call while another waits.",
        &MAX_PER_NODE,
        1,
        64,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// The connections counted per node: the table of `core::pool`.
#[derive(Default)]
struct Table(Pool);

// SAFETY: plain data, no pointers.
unsafe impl PGRXSharedMemory for Table {}

// SAFETY: the name is pg_idgen's own.
static TABLE: PgLwLock<Table> = unsafe { PgLwLock::new(c"pg_idgen connections") };

/// Requests the table's shared memory; called while preloading, with Citus.
pub fn init() {
    pgrx::pg_shmem_init!(TABLE);
}

/// Monotonic milliseconds, the same in every process.
fn now_ms() -> i64 {
    (clock::coarse_ns() / 1_000_000) as i64
}

fn my_pid() -> i32 {
    // SAFETY: a plain global of the process.
    unsafe { pg_sys::MyProcPid }
}

/// A hash of a node's address: the connections to it are counted together.
/// Two nodes sharing a hash share a count (a tighter bound, never a looser).
fn node_key(addr: &Addr) -> u64 {
    addr.describe().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// Rows of text, as a node answered them.
pub type Rows = Vec<Vec<Option<String>>>;

pub enum Failure {
    /// The connection could not be made or broke, or its session ended.
    Broken(String),
    /// No answer came in time (the session there may still be running).
    Silent(String),
    /// The node answered with an error (`IdError::Relayed`), to be raised
    /// here as it was there.
    Remote(IdError),
}

impl Failure {
    pub fn why(self) -> String {
        match self {
            Failure::Broken(why) | Failure::Silent(why) => why,
            Failure::Remote(IdError::Relayed { message, .. }) => message,
            Failure::Remote(e) => format!("{e:?}"),
        }
    }
}

/// The statements a minting connection prepares, by index: `$2` IDs of
/// logical shard `$1` (0) or of schema `$1`'s (1), in order, if role `$3`
/// may execute function `$4` there too (the one the caller called, by its
/// signature: `next_shard_id` of a schema's shard is minted by statement 1
/// but checked as `next_shard_id`); no row otherwise: grants are a node's
/// own, Citus does not carry them to the others. The role is named in
/// `pg_idgen.forwarded_for` too, for a call forwarded once more from there
/// (see `admission::forwarded_for`). Both are checked once, before the
/// first ID is minted (a sub-select is run once: not once for each row).
pub fn mint_statement(schema: bool) -> String {
    let f = catalog::qualified(if schema { "next_schema_id" } else { "next_shard_id" });
    format!(
        "SELECT {f}($1) FROM pg_catalog.generate_series(1, $2) \
          WHERE pg_catalog.has_function_privilege($3, $4, 'EXECUTE') \
            AND (SELECT pg_catalog.set_config('pg_idgen.forwarded_for', $3, true)) IS NOT NULL"
    )
}

/// How the minting node names `function` of `args` to check who may execute it.
pub fn signature(function: &str, args: &str) -> String {
    format!("{}({args})", catalog::qualified(function))
}

const STATEMENT_NAMES: [&CStr; 2] = [c"pg_idgen_shard", c"pg_idgen_schema"];
const STATEMENT_TYPES: [[pg_sys::Oid; 4]; 2] =
    [[pg_sys::INT4OID, pg_sys::INT4OID, pg_sys::NAMEOID, pg_sys::TEXTOID], [pg_sys::TEXTOID, pg_sys::INT4OID, pg_sys::NAMEOID, pg_sys::TEXTOID]];

/// How to reach `addr`: as the extension's owner, in this database, one hop
/// further than this session, the other node ending the session once unused
/// for [`IDLE`], with what Citus itself connects with appended: its
/// `citus.node_conninfo` (TLS and the like) and the owner's entry for that
/// node in `pg_dist_authinfo` (a password, a certificate), if any.
fn conninfo(addr: &Addr) -> String {
    let quote = |v: &str| format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"));
    // SAFETY: names of a role and of the current database, copied at once.
    let (user, db) = unsafe {
        let user = CStr::from_ptr(pg_sys::GetUserNameFromId(catalog::extension_owner(), false)).to_string_lossy().into_owned();
        let db = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (user, CStr::from_ptr(db).to_string_lossy().into_owned())
    };
    // SAFETY: reads a GUC's current value (NULL without Citus), copied at once.
    let extra = unsafe {
        let v = pg_sys::GetConfigOption(c"citus.node_conninfo".as_ptr(), true, false);
        if v.is_null() { String::new() } else { CStr::from_ptr(v).to_string_lossy().into_owned() }
    };
    let authinfo = metadata::authinfo(addr, &user);
    format!(
        "host={} port={} dbname={} user={} application_name={} options='-c idle_session_timeout={} -c statement_timeout={} -c pg_idgen.forwarded={}' {extra} {authinfo}",
        quote(&addr.host),
        addr.port,
        quote(&db),
        quote(&user),
        quote(FORWARDING),
        IDLE.as_millis(),
        ANSWER_TIMEOUT.as_millis(),
        (admission::forwarded() + 1).min(2),
    )
}

/// The connection's socket (-1 for none).
fn socket(conn: *mut c_void) -> c_int {
    if conn.is_null() {
        return -1;
    }
    // SAFETY: a live connection.
    unsafe { (libpq().socket)(conn) }
}

/// Reads what arrived for the command in flight: None while its answer is
/// incomplete, else its rows (none for a preparation) or what failed; every
/// result is cleared.
fn read(conn: *mut c_void) -> Option<Result<Rows, Failure>> {
    let l = libpq();
    // SAFETY: a live connection; every result is read below its counts and cleared.
    unsafe {
        if (l.consume_input)(conn) == 0 {
            return Some(Err(Failure::Broken(message((l.error_message)(conn)))));
        }
        if (l.is_busy)(conn) != 0 {
            return None;
        }
        let mut outcome = None;
        loop {
            let res = (l.get_result)(conn);
            if res.is_null() {
                break;
            }
            if outcome.is_none() {
                outcome = Some(match (l.result_status)(res) {
                    PGRES_COMMAND_OK => Ok(Vec::new()),
                    PGRES_TUPLES_OK => {
                        let (rows, columns) = ((l.ntuples)(res), (l.nfields)(res));
                        Ok((0..rows)
                            .map(|r| (0..columns).map(|f| ((l.get_is_null)(res, r, f) == 0).then(|| message((l.get_value)(res, r, f)))).collect())
                            .collect())
                    }
                    _ => Err(failure(l, conn, res)),
                });
            }
            (l.clear)(res);
        }
        Some(outcome.unwrap_or_else(|| Err(Failure::Broken("no answer".into()))))
    }
}

/// Closes a connection and waits, at most 1 s, until the other node's
/// session has ended: its socket closes only once the session has left the
/// node's process table (`socket_close` runs at `proc_exit`, after
/// `ProcKill`), so a session that takes the turn given up after this does
/// not find that one still there. False if it had not ended by then (it is
/// running a statement, which its `statement_timeout` ends).
fn finish_and_wait(conn: *mut c_void) -> bool {
    // SAFETY: duplicates the socket of a live connection; the copy is ours.
    let fd = unsafe { libc::dup(socket(conn)) };
    // SAFETY: a connection libpq made and nobody else holds.
    unsafe { (libpq().finish)(conn) };
    if fd < 0 {
        return true;
    }
    let mut ended = false;
    let deadline = Instant::now() + Duration::from_secs(1);
    let events = (pg_sys::WL_SOCKET_READABLE | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as c_int;
    let mut buf = [0u8; 256];
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).as_millis() as std::ffi::c_long;
        // SAFETY: waits on our own copy of the socket (no latch: nothing else is waited for).
        let happened = unsafe { pg_sys::WaitLatchOrSocket(std::ptr::null_mut(), events, fd, left.max(1), pg_sys::PG_WAIT_EXTENSION) };
        if left == 0 || happened & pg_sys::WL_SOCKET_READABLE as c_int == 0 {
            break;
        }
        // SAFETY: reads into a local buffer from our own socket, without blocking.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n == 0 || n < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
            ended = true;
            break;
        }
    }
    // SAFETY: our own copy of the socket, closed once.
    unsafe { libc::close(fd) };
    ended
}

// ---- a call ------------------------------------------------------------------------

/// `n` IDs of a logical shard (`schema` false, `value` its number) or of a
/// schema's, minted by the node at `addr` in the order it minted them, for
/// a call of `function` (`checked` its signature: see [`mint_statement`]).
/// `what` names the node for an error.
pub fn mint(addr: &Addr, schema: bool, value: &str, n: u32, function: &'static str, checked: &str, what: &dyn Fn() -> String) -> Vec<i64> {
    // The role the call is made for: the current one, or in a session
    // another node opened, the one that node named.
    let role = admission::forwarded_for()
        // SAFETY: the current role's name, copied at once.
        .unwrap_or_else(|| unsafe { CStr::from_ptr(pg_sys::GetUserNameFromId(pg_sys::GetUserId(), false)) }.to_string_lossy().into_owned());
    let params = [value.to_string(), n.to_string(), role.clone(), checked.to_string()];
    let rows = run(addr, Statement::Mint(schema as usize), &params, function, what);
    let ids: Vec<i64> = rows.iter().filter_map(|r| r.first().cloned().flatten()).filter_map(|v| v.parse().ok()).collect();
    match ids.len() {
        0 if rows.is_empty() => IdError::CitusNoExecute { function, node: addr.describe(), role }.raise(),
        l if l == n as usize && l == rows.len() => ids,
        l => IdError::Internal(format!("another node returned {l} IDs of {n}")).raise(),
    }
}

/// Has `addr` run `sql` with text parameters as the extension's owner, with
/// the rows of text it answers (a step of a hand-over: every step can be
/// repeated). `what` names the node for an error.
pub fn call(addr: &Addr, sql: &str, params: &[String], function: &'static str, what: &dyn Fn() -> String) -> Rows {
    run(addr, Statement::Sql(sql), params, function, what)
}

enum Statement<'a> {
    /// Minting statement `k` (see [`mint_statement`]), prepared once per connection.
    Mint(usize),
    Sql(&'a str),
}

/// Runs `statement` at `addr` over this session's connection to it, made
/// in its turn if needed; connects once more if the connection broke (a
/// statement that reached the node but whose answer was lost is run again:
/// minting then skips the IDs of the lost answer, never repeats one), not
/// if the answer did not come in time.
fn run(addr: &Addr, statement: Statement<'_>, params: &[String], function: &'static str, what: &dyn Fn() -> String) -> Rows {
    let node = node_key(addr);
    let info = conninfo(addr);
    let unreachable = |why: String| -> ! { IdError::CitusUnreachable { what: what(), node: addr.describe(), function, why }.raise() };
    let mut retried = false;
    loop {
        // Given up (the connection closed, the turn left) unless done.
        let pending = Pending(node);
        let conn = connection(addr, node, &info, function).unwrap_or_else(|why| unreachable(why));
        let outcome = send(conn, node, &statement, params).map_err(Failure::Broken).and_then(|()| answer(conn));
        match outcome {
            Ok(rows) => {
                pending.done();
                return rows;
            }
            // A cancel on the node called (an administrator's there, or its
            // statement timeout) is not the caller's own: the call failed
            // there, not here.
            Err(Failure::Remote(IdError::Relayed { sqlstate, message, .. })) if sqlstate == "57014" => {
                pending.done();
                unreachable(format!("{message} (on the node called)"))
            }
            Err(Failure::Remote(e)) => {
                pending.done();
                e.raise()
            }
            // Not made again: the session there may still be running it.
            Err(Failure::Silent(why)) => {
                drop(pending);
                unreachable(why)
            }
            Err(Failure::Broken(why)) => {
                drop(pending);
                if retried {
                    unreachable(why)
                }
                retried = true;
            }
        }
    }
}

/// Sends `statement` on `conn` with text parameters, preparing a minting
/// statement first if this connection has not.
fn send(conn: *mut c_void, node: u64, statement: &Statement<'_>, params: &[String]) -> Result<(), String> {
    let l = libpq();
    // Neither SQL nor parameters hold a NUL byte.
    let c = |t: &str| CString::new(t).unwrap_or_default();
    let params: Vec<CString> = params.iter().map(|p| c(p)).collect();
    let values: Vec<*const c_char> = params.iter().map(|p| p.as_ptr()).collect();
    let (n, null) = (values.len() as c_int, std::ptr::null::<c_int>());
    let k = match statement {
        // SAFETY (each call below): a live connection with nothing in
        // flight; the strings and arrays outlive the call.
        Statement::Sql(sql) => return sent(conn, unsafe { (l.send_query_params)(conn, c(sql).as_ptr(), n, std::ptr::null(), values.as_ptr(), null, null, 0) }),
        Statement::Mint(k) => *k,
    };
    if !CONNECTIONS.borrow_mut().iter().any(|c| c.node == node && c.prepared[k]) {
        let (sql, types) = (c(&mint_statement(k == 1)), &STATEMENT_TYPES[k]);
        sent(conn, unsafe { (l.send_prepare)(conn, STATEMENT_NAMES[k].as_ptr(), sql.as_ptr(), types.len() as c_int, types.as_ptr()) })?;
        answer(conn).map_err(Failure::why)?;
        CONNECTIONS.borrow_mut().iter_mut().filter(|c| c.node == node).for_each(|c| c.prepared[k] = true);
    }
    sent(conn, unsafe { (l.send_query_prepared)(conn, STATEMENT_NAMES[k].as_ptr(), n, values.as_ptr(), null, null, 0) })
}

/// What a `PQsend*` function returned on `conn`: 0 if it failed.
fn sent(conn: *mut c_void, returned: c_int) -> Result<(), String> {
    match returned {
        // SAFETY: a live connection.
        0 => Err(message(unsafe { (libpq().error_message)(conn) })),
        _ => Ok(()),
    }
}

/// A connection of this session's, to one node.
struct Connection {
    node: u64,
    info: String,
    conn: *mut c_void,
    prepared: [bool; 2],
}

/// The session's connections, the most recently made last.
static CONNECTIONS: BackendLocal<Vec<Connection>> = BackendLocal::new(Vec::new());

/// Closes this session's connection to `node`, if any, and then gives its
/// turn there up; if the other node's session had not ended, its entry
/// counts on until that session's statement timeout has surely ended it.
fn drop_connection(node: u64) {
    let ended = close(node);
    let until = now_ms() + (ANSWER_TIMEOUT + MARGIN).as_millis() as i64;
    let mut table = TABLE.exclusive();
    match ended {
        true => table.0.leave(my_pid(), node),
        false => table.0.linger(my_pid(), node, until),
    }
}

/// Gives the connection to a node and the turn there up unless
/// [`Pending::done`] is called first: an error or a cancel while a turn is
/// awaited or a connection made or used (an answer nobody will read).
struct Pending(u64);

impl Pending {
    /// The call is over: the connection is kept until the other node ends
    /// it, or closed now if another session waits for the node (the turn is
    /// given up once the other node's session has ended).
    fn done(self) {
        let node = self.0;
        std::mem::forget(self);
        if !TABLE.exclusive().0.done(my_pid(), node, now_ms(), (IDLE + MARGIN).as_millis() as i64) {
            drop_connection(node);
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        drop_connection(self.0);
    }
}

/// This session's open connection to `node` for `info`, kept or made in its
/// turn (waited for at most [`WAIT`], then 53300); every wait in it can be
/// cancelled. A node that refuses the connection for want of slots while
/// this server's other sessions have connections there is shared by turns
/// on those (see `Pool::refused`); past [`WAIT`], or with none there, the
/// refusal is the call's error.
fn connection(addr: &Addr, node: u64, info: &str, function: &'static str) -> Result<*mut c_void, String> {
    register_callbacks_once();
    let limit = MAX_PER_NODE.get().max(1) as usize;
    let start = Instant::now();
    let mut refusal = None;
    loop {
        let turn = TABLE.exclusive().0.ask(my_pid(), node, limit, now_ms());
        match turn {
            Turn::Kept => {
                let all = CONNECTIONS.borrow_mut();
                // SAFETY: reads the status of a live connection.
                if let Some(c) = all.iter().find(|c| c.node == node && c.info == info && unsafe { (libpq().status)(c.conn) } == CONNECTION_OK) {
                    return Ok(c.conn);
                }
            }
            Turn::Granted => {}
            Turn::Wait if start.elapsed() < WAIT => {
                nap();
                continue;
            }
            Turn::Wait => {
                if let Some(why) = refusal {
                    return Err(why);
                }
                let limit = limit as u32;
                IdError::CitusTooManyConnections { node: addr.describe(), function, limit, waited_s: WAIT.as_secs() }.raise()
            }
        }
        match connect(node, info) {
            Err(why) if out_of_slots(&why) && start.elapsed() < WAIT => {
                // A refused connection has no session there.
                close(node);
                if !TABLE.exclusive().0.refused(my_pid(), node, now_ms(), now_ms() + 5_000) {
                    return Err(why);
                }
                refusal = Some(why);
                nap();
            }
            made => return made,
        }
    }
}

/// Whether a node refused a connection for want of slots: PostgreSQL's
/// wordings (15 to 18), in English or as this server translates them (the
/// nodes of a cluster are set up alike), and pg_idgen's own in `admission`.
fn out_of_slots(why: &str) -> bool {
    const REFUSALS: [&CStr; 4] = [
        c"sorry, too many clients already",
        c"remaining connection slots are reserved for non-replication superuser connections",
        c"remaining connection slots are reserved for roles with the %s attribute",
        c"remaining connection slots are reserved for roles with privileges of the \"%s\" role",
    ];
    extern "C" {
        fn gettext(msgid: *const c_char) -> *mut c_char;
    }
    let known = |text: &str| {
        let text = text.split('%').next().unwrap_or_default();
        !text.is_empty() && why.contains(text)
    };
    why.contains("remaining connection slots are reserved")
        || REFUSALS.iter().any(|m| {
            // SAFETY: gettext returns the msgid or a translation it owns, NUL-terminated, copied at once.
            let translated = unsafe { CStr::from_ptr(gettext(m.as_ptr())) }.to_string_lossy().into_owned();
            known(&m.to_string_lossy()) || known(&translated)
        })
}

/// Closes this session's connection to `node`, if any, waiting for the
/// other node's session to end (see [`finish_and_wait`]): whether it did.
fn close(node: u64) -> bool {
    let mut all = CONNECTIONS.borrow_mut();
    let gone = all.iter().position(|c| c.node == node).map(|i| all.remove(i));
    drop(all);
    gone.is_none_or(|c| finish_and_wait(c.conn))
}

/// Connects to `node` with `info` in this session's turn there, closing the
/// session's connection to it that is not usable (the node ended it, idle,
/// or it was made with another conninfo), and its oldest connection if it
/// has as many as it keeps.
fn connect(node: u64, info: &str) -> Result<*mut c_void, String> {
    close(node);
    let oldest = {
        let all = CONNECTIONS.borrow_mut();
        (all.len() >= MAX_CONNECTIONS).then(|| all[0].node)
    };
    if let Some(node) = oldest {
        drop_connection(node);
    }
    let l = libpq();
    // SAFETY: libpq's non-blocking connect, which copies the string.
    let conn = unsafe { (l.connect_start)(CString::new(info).unwrap_or_default().as_ptr()) };
    if conn.is_null() {
        return Err("out of memory".into());
    }
    // Kept, failed or not, until `close` finishes it.
    CONNECTIONS.borrow_mut().push(Connection { node, info: info.to_owned(), conn, prepared: [false; 2] });
    // SAFETY (here and below): a live connection.
    if unsafe { (l.status)(conn) } == CONNECTION_BAD {
        return Err(message(unsafe { (l.error_message)(conn) }));
    }
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    let mut writing = true;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !wait(conn, writing, left) {
            return Err(format!("timeout expired after {} s", CONNECT_TIMEOUT.as_secs()));
        }
        // One step of libpq's connection sequence, its socket being ready.
        writing = match unsafe { (l.connect_poll)(conn) } {
            PGRES_POLLING_OK => return Ok(conn),
            PGRES_POLLING_READING => false,
            PGRES_POLLING_WRITING => true,
            _ => return Err(message(unsafe { (l.error_message)(conn) })),
        };
    }
}

/// Sleeps on this backend's latch for a few milliseconds, then raises a
/// pending cancel or termination.
fn nap() {
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH) as c_int;
    // SAFETY: waits on and resets this backend's own latch.
    unsafe {
        pg_sys::WaitLatch(pg_sys::MyLatch, events, 5, pg_sys::PG_WAIT_EXTENSION);
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pg_sys::check_for_interrupts!();
}

/// Waits for the answer to the command sent on `conn`, at most ANSWER_TIMEOUT.
fn answer(conn: *mut c_void) -> Result<Rows, Failure> {
    let deadline = Instant::now() + ANSWER_TIMEOUT;
    loop {
        if let Some(outcome) = read(conn) {
            return outcome;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Failure::Silent(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs())));
        }
        wait(conn, false, left);
    }
}

/// Waits until `conn`'s socket is readable (or writable), or `timeout`
/// passes (false), on the process latch too, so that a cancel or shutdown
/// is raised here.
fn wait(conn: *mut c_void, writing: bool, timeout: Duration) -> bool {
    let socket_event = if writing { pg_sys::WL_SOCKET_WRITEABLE } else { pg_sys::WL_SOCKET_READABLE };
    let events = (pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH | socket_event | pg_sys::WL_TIMEOUT) as c_int;
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as std::ffi::c_long;
    // SAFETY: waits on our own latch and a live connection's socket.
    let happened = unsafe { pg_sys::WaitLatchOrSocket(pg_sys::MyLatch, events, socket(conn), ms, pg_sys::PG_WAIT_EXTENSION) };
    // SAFETY: resets our own latch before looking for interrupts.
    unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
    pg_sys::check_for_interrupts!();
    happened & pg_sys::WL_TIMEOUT as c_int == 0
}

fn register_callbacks_once() {
    static REGISTERED: BackendLocal<bool> = BackendLocal::new(false);
    if !REGISTERED.get() {
        REGISTERED.set(true);
        // SAFETY: registers a callback that closes our connections and
        // frees our entries of the table, before shared memory is left.
        unsafe { pg_sys::before_shmem_exit(Some(close_at_exit), pg_sys::Datum::from(0)) };
    }
}

unsafe extern "C-unwind" fn close_at_exit(_code: c_int, _arg: pg_sys::Datum) {
    let nodes: Vec<u64> = CONNECTIONS.borrow_mut().iter().map(|c| c.node).collect();
    nodes.into_iter().for_each(drop_connection);
    TABLE.exclusive().0.exit(my_pid());
}

fn message(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string libpq owns, copied at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().trim_end().to_string()
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

/// Declares the libpq functions we call, each as libpq-fe.h declares it
/// (`*mut c_void` for a connection or a result), and how to resolve them.
macro_rules! libpq_functions {
    ($($field:ident = $symbol:literal: fn($($arg:ty),*) -> $ret:ty;)*) => {
        struct Libpq {
            $($field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        /// # Safety
        /// `handle` is libpq's, from `dlopen`.
        unsafe fn resolve(handle: *mut c_void) -> Libpq {
            Libpq {
                $($field: {
                    // SAFETY: looks a symbol up in a live handle.
                    let p = unsafe { dlsym(handle, $symbol.as_ptr()) };
                    if p.is_null() {
                        IdError::Internal(format!("libpq has no {:?}", $symbol)).raise()
                    }
                    // SAFETY: the symbol's type is the one declared with it above.
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                },)*
            }
        }
    };
}

type Oids = *const pg_sys::Oid;
type Texts = *const *const c_char;

libpq_functions! {
    connect_start = c"PQconnectStart": fn(*const c_char) -> *mut c_void;
    connect_poll = c"PQconnectPoll": fn(*mut c_void) -> c_int;
    status = c"PQstatus": fn(*const c_void) -> c_int;
    error_message = c"PQerrorMessage": fn(*const c_void) -> *const c_char;
    finish = c"PQfinish": fn(*mut c_void) -> ();
    socket = c"PQsocket": fn(*const c_void) -> c_int;
    send_prepare = c"PQsendPrepare": fn(*mut c_void, *const c_char, *const c_char, c_int, Oids) -> c_int;
    send_query_prepared = c"PQsendQueryPrepared": fn(*mut c_void, *const c_char, c_int, Texts, *const c_int, *const c_int, c_int) -> c_int;
    send_query_params = c"PQsendQueryParams": fn(*mut c_void, *const c_char, c_int, Oids, Texts, *const c_int, *const c_int, c_int) -> c_int;
    consume_input = c"PQconsumeInput": fn(*mut c_void) -> c_int;
    is_busy = c"PQisBusy": fn(*mut c_void) -> c_int;
    get_result = c"PQgetResult": fn(*mut c_void) -> *mut c_void;
    result_status = c"PQresultStatus": fn(*const c_void) -> c_int;
    ntuples = c"PQntuples": fn(*const c_void) -> c_int;
    nfields = c"PQnfields": fn(*const c_void) -> c_int;
    get_is_null = c"PQgetisnull": fn(*const c_void, c_int, c_int) -> c_int;
    get_value = c"PQgetvalue": fn(*const c_void, c_int, c_int) -> *const c_char;
    result_error_field = c"PQresultErrorField": fn(*const c_void, c_int) -> *const c_char;
    clear = c"PQclear": fn(*mut c_void) -> ();
}

extern "C" {
    fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
}

/// The libpq Citus loaded (same soname), resolved once per process.
fn libpq() -> &'static Libpq {
    static LIBPQ: once_cell::sync::OnceCell<Libpq> = once_cell::sync::OnceCell::new();
    LIBPQ.get_or_init(|| {
        const RTLD_NOW: c_int = 2;
        // SAFETY: dlopen of a library by soname; the handle is kept for good.
        let handle = unsafe { dlopen(c"libpq.so.5".as_ptr(), RTLD_NOW) };
        if handle.is_null() {
            IdError::Internal("libpq.so.5 cannot be loaded".into()).raise()
        }
        // SAFETY: libpq's handle.
        unsafe { resolve(handle) }
    })
}
