//! Copies of this server, seen without a lease store: a standby promoted
//! (or a copy of a standby's data directory started as a primary) while the
//! primary it replicated from still runs. Both then mint the same shards.
//!
//! The one trace such a copy keeps of where it came from is
//! `primary_conninfo`. After every start, crash recovery and promotion, the
//! ownership loader (see `fleet`), once loaded, asks the server it names, if
//! any, over a replication connection (PostgreSQL's own walreceiver
//! library, as the standby itself connected): its system identifier
//! (`IDENTIFY_SYSTEM`) and whether it is in recovery (`SHOW
//! in_hot_standby`). A server of the same system identifier that is not in
//! recovery is another primary of this data: logged as a WARNING and shown
//! by `id_generator_copies()`. The question is bounded by `ASK_TIMEOUT`;
//! nothing waits for it (minting is already open). With a lease store
//! nothing is asked: the store decides who mints.
//!
//! A copy made otherwise (a file-system snapshot, `pg_basebackup` without
//! `-R` started as a primary, a primary cloned while it runs) names no
//! origin and cannot be seen from inside: that takes a lease store.

use std::ffi::{c_char, CStr, CString};
use std::time::Duration;

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;
use pgrx::PGRXSharedMemory;

use crate::catalog;
use crate::clock::{self, timestamptz};
use crate::core::layout;
use crate::errors::IdError;

/// The longest a question to the origin may take, connecting included.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// What the last question found, written by the loader.
// SAFETY: the name is pg_idgen's own.
pub static SEEN: PgLwLock<Seen> = unsafe { PgLwLock::new(c"pg_idgen copies") };

const TEXT: usize = 256;

#[derive(Clone, Copy)]
pub struct Seen {
    /// When (Unix µs); 0: never asked (no `primary_conninfo`).
    at_us: i64,
    state: State,
    /// The origin's host and port (never the conninfo: it may hold a password).
    server: [u8; TEXT],
    /// Why it could not be asked, or the origin's system identifier.
    detail: [u8; TEXT],
}

impl Default for Seen {
    fn default() -> Self {
        Seen { at_us: 0, state: State::Unreachable, server: [0; TEXT], detail: [0; TEXT] }
    }
}

// SAFETY: plain data, no pointers.
unsafe impl PGRXSharedMemory for Seen {}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Another primary of this data: it mints what this server mints.
    Primary,
    /// The origin is in recovery (a standby, of this server or not yet promoted).
    Standby,
    /// The origin is another system (another system identifier).
    OtherSystem,
    /// primary_conninfo names this very server.
    Itself,
    Unreachable,
    /// Asked, and no answer recorded: the question was cut short.
    Asking,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Primary => "another primary",
            State::Standby => "standby",
            State::OtherSystem => "another system",
            State::Itself => "this server",
            State::Unreachable => "unreachable",
            State::Asking => "asking",
        }
    }
}

fn text(s: &str) -> [u8; TEXT] {
    let mut out = [0; TEXT];
    // At most TEXT - 1 bytes, cut at a character boundary.
    let mut end = s.len().min(TEXT - 1);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    out[..end].copy_from_slice(&s.as_bytes()[..end]);
    out
}

fn untext(b: &[u8; TEXT]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(TEXT);
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// Asks the server `primary_conninfo` names, if this server is a primary
/// and names one, and records (and logs) what it answered. Called by the
/// loader, connected to a database, in a transaction.
pub fn check() {
    // SAFETY: plain reads of the server's state and a GUC (copied at once).
    let conninfo = unsafe {
        if pg_sys::RecoveryInProgress() {
            return;
        }
        let v = pg_sys::GetConfigOption(c"primary_conninfo".as_ptr(), true, false);
        if v.is_null() { String::new() } else { CStr::from_ptr(v).to_string_lossy().into_owned() }
    };
    // With a lease store, the store decides who mints: nothing to ask.
    if conninfo.trim().is_empty() || crate::settings::lease_store().is_some() {
        return;
    }
    // Recorded first, so that a question cut short (the loader terminated)
    // shows as begun and never answered.
    record(State::Asking, "the server of primary_conninfo", "");
    let (state, server, detail) = match ask(&conninfo) {
        Ok(found) => found,
        Err((server, why)) => (State::Unreachable, server, why),
    };
    if state == State::Primary {
        warning!(
            "pg_idgen: another primary of this data runs at {server} (system identifier {detail}, named by primary_conninfo): \
             both mint the same shards; stop one, give each its own shards (shard_claim), or use a lease store (pg_idgen.lease_store)"
        );
    } else {
        log!("pg_idgen: the server primary_conninfo names ({server}) is {}: {detail}", state.name());
    }
    record(state, &server, &detail);
}

fn record(state: State, server: &str, detail: &str) {
    *SEEN.exclusive() = Seen { at_us: clock::unix_us(), state, server: text(server), detail: text(detail) };
}

/// Makes the shared record (called from `_PG_init` while preloading).
pub fn init() {
    pgrx::pg_shmem_init!(SEEN);
}

type Found = (State, String, String);

/// The question, bounded: a POSIX timer sends this process SIGINT after
/// `ASK_TIMEOUT`, which PostgreSQL's own handler turns into a cancel at the
/// next wait of the walreceiver library (what `statement_timeout` does),
/// and SIGTERM ends the process at once (`die`, as the walreceiver's own),
/// so that a silent or frozen origin holds up neither the loader nor a
/// shutdown. An error (the cancel, a broken connection) is caught in a
/// subtransaction of its own and answered as the origin unreachable.
fn ask(conninfo: &str) -> Result<Found, (String, String)> {
    let server = std::cell::RefCell::new(String::from("the server of primary_conninfo"));
    // SAFETY: the signal handlers are PostgreSQL's own; the timer is this
    // process's, deleted before returning; the subtransaction is begun and
    // ended here, and the memory context and resource owner put back as
    // PL/pgSQL does after a caught error.
    let outcome = unsafe {
        handlers::set(libc::SIGINT, handlers::StatementCancelHandler);
        handlers::set(libc::SIGTERM, handlers::die);
        let timer = Timer::start(ASK_TIMEOUT);
        let began = std::time::Instant::now();
        let ctx = pg_sys::CurrentMemoryContext;
        let owner = pg_sys::CurrentResourceOwner;
        pg_sys::BeginInternalSubTransaction(std::ptr::null());
        let outcome = PgTryBuilder::new(std::panic::AssertUnwindSafe(|| walsender(conninfo, &server)))
            .catch_others(|e| match began.elapsed() >= ASK_TIMEOUT {
                // The timer's cancel.
                true => Err(format!("no answer within {} s", ASK_TIMEOUT.as_secs())),
                false => Err(caught(e)),
            })
            .execute();
        drop(timer);
        // A cancel the timer sent after the answer came is not ours to act on.
        pg_sys::QueryCancelPending = 0;
        match outcome {
            Ok(_) => pg_sys::ReleaseCurrentSubTransaction(),
            Err(_) => pg_sys::RollbackAndReleaseCurrentSubTransaction(),
        }
        pg_sys::MemoryContextSwitchTo(ctx);
        pg_sys::CurrentResourceOwner = owner;
        outcome
    };
    outcome.map_err(|why| (server.into_inner(), why))
}

/// PostgreSQL's signal handlers themselves (pg_sys wraps its functions in
/// Rust ones, which a signal must not call): `void f(SIGNAL_ARGS)`.
mod handlers {
    use pgrx::pg_sys;
    use std::ffi::c_int;

    extern "C-unwind" {
        pub fn StatementCancelHandler(signal: c_int);
        pub fn die(signal: c_int);
    }

    /// Installs `handler` for `signal` (`pqsignal`, a macro for `pqsignal_be` in 18).
    ///
    /// # Safety
    /// `handler` is one of PostgreSQL's own signal handlers.
    pub unsafe fn set(signal: c_int, handler: unsafe extern "C-unwind" fn(c_int)) {
        // SAFETY: the caller's.
        unsafe {
            #[cfg(not(feature = "pg18"))]
            pg_sys::pqsignal(signal, Some(handler));
            #[cfg(feature = "pg18")]
            pg_sys::pqsignal_be(signal, Some(handler));
        }
    }
}

/// A one-shot POSIX timer that sends this process SIGINT; deleted on drop.
struct Timer(Option<libc::timer_t>);

impl Timer {
    fn start(after: Duration) -> Timer {
        // SAFETY: plain libc calls on values owned here.
        unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_SIGNAL;
            event.sigev_signo = libc::SIGINT;
            let mut id: libc::timer_t = std::mem::zeroed();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut id) != 0 {
                return Timer(None);
            }
            let mut when: libc::itimerspec = std::mem::zeroed();
            when.it_value.tv_sec = after.as_secs() as libc::time_t;
            libc::timer_settime(id, 0, &when, std::ptr::null_mut());
            Timer(Some(id))
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(id) = self.0 {
            // SAFETY: a timer this value created.
            unsafe { libc::timer_delete(id) };
        }
    }
}

fn caught(e: pg_sys::panic::CaughtError) -> String {
    match e {
        pg_sys::panic::CaughtError::PostgresError(r) | pg_sys::panic::CaughtError::ErrorReport(r) => r.message().to_string(),
        pg_sys::panic::CaughtError::RustPanic { ereport, .. } => ereport.message().to_string(),
    }
}

/// Connects to the origin's walsender, as the walreceiver would, and asks.
fn walsender(conninfo: &str, server: &std::cell::RefCell<String>) -> Result<Found, String> {
    // Named uniquely, so that this server can tell whether the session it
    // opened is its own (primary_conninfo naming itself, as a name that
    // follows the primary in DNS does after a failover). Set in the conninfo
    // itself, after everything in it: an application_name there or in
    // PGAPPNAME would otherwise win.
    // SAFETY: a plain global of this process.
    let name = format!("pg_idgen_copy_check_{}_{}", unsafe { pg_sys::MyProcPid }, clock::unix_us());
    let conninfo = with_own_name(conninfo, &name);
    let info = CString::new(conninfo).map_err(|_| "primary_conninfo holds a NUL byte".to_string())?;
    let mut err: *mut c_char = std::ptr::null_mut();
    // SAFETY: PostgreSQL's walreceiver library, loaded as the walreceiver
    // loads it, called through the function table it fills in (typed by
    // the server's headers); the connection is closed before returning,
    // and on an error by the subtransaction's abort (its socket is closed
    // at process exit at the latest).
    unsafe {
        pg_sys::load_file(c"libpqwalreceiver".as_ptr(), false);
        let f = &*pg_sys::WalReceiverFunctions;
        let missing = || "the walreceiver library left its function table incomplete".to_string();
        let (Some(connect), Some(senderinfo), Some(identify), Some(exec), Some(disconnect)) =
            (f.walrcv_connect, f.walrcv_get_senderinfo, f.walrcv_identify_system, f.walrcv_exec, f.walrcv_disconnect)
        else {
            return Err(missing());
        };
        let appname = c"pg_idgen copy check".as_ptr();
        #[cfg(feature = "pg15")]
        let conn = guarded(|| connect(info.as_ptr(), false, appname, &mut err));
        #[cfg(feature = "pg16")]
        let conn = guarded(|| connect(info.as_ptr(), false, false, appname, &mut err));
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        let conn = guarded(|| connect(info.as_ptr(), true, false, false, appname, &mut err));
        if conn.is_null() {
            return Err(if err.is_null() { "could not connect".into() } else { CStr::from_ptr(err).to_string_lossy().trim_end().to_string() });
        }
        let (mut host, mut port) = (std::ptr::null_mut(), 0);
        guarded(|| senderinfo(conn, &mut host, &mut port));
        if !host.is_null() {
            *server.borrow_mut() = format!("{}:{port}", CStr::from_ptr(host).to_string_lossy());
        }
        if itself(&name) {
            guarded(|| disconnect(conn));
            return Ok((State::Itself, server.borrow().clone(), "primary_conninfo names this server".into()));
        }
        let mut tli = 0;
        let system = CStr::from_ptr(guarded(|| identify(conn, &mut tli))).to_string_lossy().into_owned();
        let recovering = show(exec, conn, c"SHOW in_hot_standby");
        guarded(|| disconnect(conn));
        let recovering = recovering?;
        let ours = pg_sys::GetSystemIdentifier().to_string();
        let server = server.borrow().clone();
        match (system == ours, recovering.as_str()) {
            (false, _) => Ok((State::OtherSystem, server, format!("system identifier {system}, this server's {ours}"))),
            (true, "off") => Ok((State::Primary, server, system)),
            (true, "on") => Ok((State::Standby, server, "in_hot_standby = on".into())),
            (true, other) => Err(format!("in_hot_standby answered {:?}", other.chars().take(40).collect::<String>())),
        }
    }
}

/// Calls a function of the walreceiver library's table: an ERROR it raises
/// becomes a Rust panic that `ask` catches (a call through a function
/// pointer has no guard of pgrx's own).
///
/// # Safety
/// `f` calls a walreceiver function with valid arguments.
unsafe fn guarded<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: the caller's; this is the backend's main thread.
    unsafe { pg_sys::submodules::ffi::pg_guard_ffi_boundary(f) }
}

/// `conninfo` with `application_name=name` after everything in it, where
/// libpq reads it last. In a URI, the parameters follow the first `?` after
/// the host (a `?` in the user's password comes before the `@`); in the
/// keyword form, a last lone backslash (which libpq ignores at the end)
/// would escape the separating space, so it goes.
fn with_own_name(conninfo: &str, name: &str) -> String {
    let c = conninfo.trim();
    match ["postgresql://", "postgres://"].iter().find_map(|s| c.strip_prefix(s).map(|rest| (s.len(), rest))) {
        Some((scheme, rest)) => {
            let host = match rest.find(['@', '/']) {
                Some(i) if rest.as_bytes()[i] == b'@' => scheme + i + 1,
                _ => scheme,
            };
            format!("{c}{}application_name={name}", if c[host..].contains('?') { '&' } else { '?' })
        }
        None => {
            let trailing = c.len() - c.trim_end_matches('\\').len();
            let c = if trailing % 2 == 1 { &c[..c.len() - 1] } else { c };
            format!("{c} application_name={name}")
        }
    }
}

/// Whether this server has a replication session named `name`: the one
/// the question opened, if it came here.
fn itself(name: &str) -> bool {
    catalog::query_one::<bool>(
        "SELECT EXISTS (SELECT FROM pg_catalog.pg_stat_replication WHERE application_name OPERATOR(pg_catalog.=) $1)",
        &[name.into()],
    )
    .unwrap_or(false)
}

/// The one text value a replication command answers.
///
/// # Safety
/// `conn` is a live walreceiver connection of `exec`'s library.
unsafe fn show(
    exec: unsafe extern "C-unwind" fn(*mut pg_sys::WalReceiverConn, *const c_char, i32, *const pg_sys::Oid) -> *mut pg_sys::WalRcvExecResult,
    conn: *mut pg_sys::WalReceiverConn,
    command: &CStr,
) -> Result<String, String> {
    let types = [pg_sys::TEXTOID];
    // SAFETY: the caller's; the result's tuple store is read with a slot of
    // its own descriptor and everything is freed with the (sub)transaction.
    unsafe {
        let res = guarded(|| exec(conn, command.as_ptr(), 1, types.as_ptr()));
        if (*res).status != pg_sys::WalRcvExecStatus::WALRCV_OK_TUPLES {
            let err = (*res).err;
            return Err(if err.is_null() { format!("{command:?} failed") } else { CStr::from_ptr(err).to_string_lossy().trim_end().to_string() });
        }
        let slot = pg_sys::MakeSingleTupleTableSlot((*res).tupledesc, &pg_sys::TTSOpsMinimalTuple);
        let value = match pg_sys::tuplestore_gettupleslot((*res).tuplestore, true, false, slot) {
            false => Err(format!("{command:?} answered no row")),
            true => {
                pg_sys::slot_getsomeattrs_int(slot, 1);
                match *(*slot).tts_isnull {
                    true => Err(format!("{command:?} answered NULL")),
                    false => {
                        let v = pg_sys::text_to_cstring((*(*slot).tts_values).cast_mut_ptr::<pg_sys::text>());
                        Ok(CStr::from_ptr(v).to_string_lossy().into_owned())
                    }
                }
            }
        };
        // The tuple store may have spilled to a temporary file: closed here,
        // not left to the end of the subtransaction (which warns of a leak).
        pg_sys::ExecDropSingleTupleTableSlot(slot);
        pg_sys::tuplestore_end((*res).tuplestore);
        value
    }
}

/// What the last question to the server `primary_conninfo` names found:
/// one row once asked (after a start, crash recovery or promotion of a
/// primary with `primary_conninfo` set), none otherwise.
#[pg_extern(volatile, parallel_safe)]
fn id_generator_copies() -> TableIterator<
    'static,
    (name!(checked_at, TimestampWithTimeZone), name!(origin, String), name!(state, String), name!(detail, String)),
> {
    if !crate::settings::is_preloaded() {
        IdError::NotPreloaded.raise()
    }
    let seen = *SEEN.share();
    if seen.at_us == 0 {
        return TableIterator::new(Vec::new());
    }
    let at = timestamptz(layout::timestamptz_of_ms(seen.at_us.div_euclid(1000), 0));
    TableIterator::once((at, untext(&seen.server), seen.state.name().to_string(), untext(&seen.detail)))
}

#[cfg(test)]
mod tests {
    use super::with_own_name;

    #[test]
    fn the_own_name_is_read_last_whatever_the_form() {
        let n = "pg_idgen_copy_check_1_2";
        for (conninfo, expected) in [
            ("host=a port=5432", "host=a port=5432 application_name=pg_idgen_copy_check_1_2"),
            ("host=a application_name=x\\", "host=a application_name=x application_name=pg_idgen_copy_check_1_2"),
            ("host=a password=p\\\\", "host=a password=p\\\\ application_name=pg_idgen_copy_check_1_2"),
            ("postgresql://u:pa?ss@h:1/db", "postgresql://u:pa?ss@h:1/db?application_name=pg_idgen_copy_check_1_2"),
            ("postgresql://u@h/db?sslmode=disable", "postgresql://u@h/db?sslmode=disable&application_name=pg_idgen_copy_check_1_2"),
            ("postgres://h:1", "postgres://h:1?application_name=pg_idgen_copy_check_1_2"),
            ("postgresql:///db?host=/tmp", "postgresql:///db?host=/tmp&application_name=pg_idgen_copy_check_1_2"),
        ] {
            assert_eq!(with_own_name(conninfo, n), expected, "{conninfo}");
        }
    }
}
