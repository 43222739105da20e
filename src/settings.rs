//! The server settings (`pg_idgen.*`); Citus's two are defined in `citus`.

use std::ffi::{CStr, CString};

use once_cell::sync::OnceCell;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::errors::{IdError, OrRaise};
use crate::core::layout::{parse_epoch, MAX_SHARD};

const EPOCH_NAME: &CStr = c"pg_idgen.epoch";
/// The default epoch. IDs can carry times from it until 2060-11-03.
pub const DEFAULT_EPOCH: &CStr = c"2026-01-01 00:00:00+00";

static EPOCH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(DEFAULT_EPOCH));
static EPOCH_UNIX_MS: OnceCell<i64> = OnceCell::new();
static MAX_CLOCK_LEAD_MS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
static PUBLIC_ID_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static FLEET_DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"postgres"));
/// How many databases keep a shared reservation of the high-water mark.
static MAX_DATABASES: GucSetting<i32> = GucSetting::<i32>::new(1000);
static LEASE_STORE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static LEASE_PREFIX: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"/pg_idgen/"));
static LEASE_SHARDS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static LEASE_LEADER_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static LEASE_AUTO_SHARDS: GucSetting<i32> = GucSetting::<i32>::new(0);
static LEASE_TTL: GucSetting<i32> = GucSetting::<i32>::new(10);
static REWRITE_TIME_FILTERS: GucSetting<bool> = GucSetting::<bool>::new(true);
static TRACK_STATUS: GucSetting<bool> = GucSetting::<bool>::new(true);

/// Set in the postmaster while preloading; backends inherit it through fork.
static PRELOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Notes that the library is being preloaded (before the settings are
/// defined, which ask). Called from `_PG_init`.
pub fn set_preloaded() {
    PRELOADED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether the library was loaded by `shared_preload_libraries`.
pub fn is_preloaded() -> bool {
    PRELOADED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Defines the settings. The epoch is a postmaster-level setting, which
/// PostgreSQL only allows a library to define while it is preloaded.
pub fn register(preloading: bool) {
    if preloading {
        GucRegistry::define_string_guc(
            EPOCH_NAME,
            c"The instant from which pg_idgen IDs count milliseconds (UTC).",
            c"Fixed at server start. Changing it once IDs exist breaks their ordering and uniqueness.",
            &EPOCH,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        // Refuse to start with an epoch that cannot be parsed.
        configured_epoch_ms();
        GucRegistry::define_string_guc(
            c"pg_idgen.fleet_database",
            c"The database that records which logical shards this server mints for.",
            c"shard_claim, shard_release and shard_adopt run there; every database of the server follows it.",
            &FLEET_DATABASE,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        GucRegistry::define_int_guc(
            c"pg_idgen.max_databases",
            c"How many databases of the server share a reservation of the high-water mark in shared memory.",
            c"16 bytes of shared memory each. Past it, each session of another database keeps a reservation of its own, \
              which may cost a WAL flush per session and second of minting.",
            &MAX_DATABASES,
            1,
            1_000_000,
            GucContext::Postmaster,
            GucFlags::default(),
        );
        register_leases();
    }
    GucRegistry::define_int_guc(
        c"pg_idgen.max_clock_lead_ms",
        c"How far the time of a new ID may run ahead of the system clock.",
        c"A shard that uses up a millisecond, or a clock that steps back, makes pg_idgen borrow time ahead; \
          past this bound minting waits briefly, then raises an error. One value for the whole server, \
          whose generators every session shares: no role's setting can make another role's mint fail.",
        &MAX_CLOCK_LEAD_MS,
        0,
        86_400_000,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_bool_guc(
        c"pg_idgen.track_status",
        c"Counts IDs, waits, borrowed milliseconds and clock regressions for the status functions.",
        c"Costs one atomic increment per ID; the last ID and the lead are shown either way.",
        &TRACK_STATUS,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"pg_idgen.rewrite_time_filters",
        c"Turns comparisons of id_ts() and uuid_v7_ts() with a time into primary-key ranges.",
        c"Adds the implied key range to each such condition, so that an index on the key serves it.",
        &REWRITE_TIME_FILTERS,
        GucContext::Userset,
        GucFlags::default(),
    );
    // SAFETY: the show hook cannot panic or raise (see `show_public_id_key`).
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"pg_idgen.public_id_key",
            c"The 128-bit key (32 hexadecimal digits) of id_public() and id_from_public().",
            c"No role can read it back: SHOW prints only whether it is set and id_public(0). Changing it changes every public ID.",
            &PUBLIC_ID_KEY,
            GucContext::Suset,
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL,
            Some(check_public_id_key),
            None,
            Some(show_public_id_key),
        );
    }
}

/// The lease settings (see `lease`), fixed at server start; a list of
/// shards that cannot be read stops the server from starting.
fn register_leases() {
    GucRegistry::define_string_guc(
        c"pg_idgen.lease_store",
        c"The lease store (etcd v3, http://host:port, comma-separated) that grants this server its shards.",
        c"Empty: no leases, every shard not released mints. Set: a shard mints only under a lease this server holds.",
        &LEASE_STORE,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_idgen.lease_prefix",
        c"The prefix of pg_idgen's keys in the lease store.",
        c"Servers that share shards share the prefix; fleets with separate ID spaces use different ones.",
        &LEASE_PREFIX,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_idgen.lease_shards",
        c"The shards this server asks the lease store for (numbers and ranges, such as 0-99,200).",
        c"Each is minted only while its lease is held; one held by another server waits until it is free.",
        &LEASE_SHARDS,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_idgen.lease_auto_shards",
        c"How many free shards this server asks the lease store for, besides pg_idgen.lease_shards.",
        c"The lowest free shards, those it held before a restart first; shard_leases() shows which.",
        &LEASE_AUTO_SHARDS,
        0,
        MAX_SHARD + 1,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"pg_idgen.lease_leader_key",
        c"A writer election in the lease store (Patroni's leader key) and this server's name in it, as key=name.",
        c"While the key names this server, it takes at once the shards an earlier primary of the same data still holds; while it names another, this server mints none.",
        &LEASE_LEADER_KEY,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pg_idgen.lease_ttl",
        c"The time to live of this server's lease in the lease store.",
        c"Renewed three times per TTL; minting stops a margin (a fifth of it, at least 1 s) before the lease can run out.",
        &LEASE_TTL,
        2,
        3600,
        GucContext::Postmaster,
        GucFlags::UNIT_S,
    );
    if let Err(e) = lease_shards() {
        IdError::InvalidSetting { name: "pg_idgen.lease_shards", why: e }.raise()
    }
    if let Err(e) = lease_leader() {
        IdError::InvalidSetting { name: "pg_idgen.lease_leader_key", why: e }.raise()
    }
    if let Some(store) = lease_store() {
        if let Err(e) = crate::lease::etcd::Store::parse(&store) {
            IdError::InvalidSetting { name: "pg_idgen.lease_store", why: e }.raise()
        }
    }
}

fn text(setting: &GucSetting<Option<CString>>) -> Option<String> {
    setting.get().map(|s| s.to_string_lossy().trim().to_string()).filter(|s| !s.is_empty())
}

/// `pg_idgen.lease_store`, when set (and the library preloaded).
pub fn lease_store() -> Option<String> {
    if !is_preloaded() {
        return None;
    }
    text(&LEASE_STORE)
}

/// `pg_idgen.lease_prefix`, ending in `/`.
pub fn lease_prefix() -> String {
    crate::core::lease::normalized_prefix(&text(&LEASE_PREFIX).unwrap_or_default())
}

/// `pg_idgen.lease_shards`, read.
pub fn lease_shards() -> Result<Vec<u16>, String> {
    crate::core::lease::parse_shards(&text(&LEASE_SHARDS).unwrap_or_default())
}

/// `pg_idgen.lease_leader_key`, read: the key and this server's name in it.
pub fn lease_leader() -> Result<Option<(String, String)>, String> {
    crate::core::lease::parse_leader(&text(&LEASE_LEADER_KEY).unwrap_or_default())
}

pub fn lease_auto_shards() -> usize {
    LEASE_AUTO_SHARDS.get().max(0) as usize
}

/// `pg_idgen.lease_ttl`, in seconds.
pub fn lease_ttl_s() -> i64 {
    i64::from(LEASE_TTL.get().max(2))
}

/// The server's epoch as Unix milliseconds, read once per process: the
/// preloaded library's `pg_idgen.epoch`, fixed at server start. Without the
/// preload the setting is only a placeholder, which any role could set for
/// its own session, so it is never read: the default epoch stands in.
/// Decoding uses the epoch persisted in each database (see `epoch`).
pub fn configured_epoch_ms() -> i64 {
    *EPOCH_UNIX_MS.get_or_init(|| {
        let text = match EPOCH.get() {
            Some(v) if is_preloaded() => v.to_string_lossy().into_owned(),
            _ => DEFAULT_EPOCH.to_string_lossy().into_owned(),
        };
        parse_epoch(&text).ok_or(IdError::InvalidEpoch(text)).or_raise()
    })
}

/// The public-ID key is taken only from the configuration files (and the
/// defaults): a value set any other way is readable by other roles or kept
/// where they read it (`pg_db_role_setting` for `ALTER ROLE`/`ALTER
/// DATABASE ... SET`, `pg_proc.proconfig` for a function's `SET` clause,
/// `ps` for the command line; the statement text of `SET` and
/// `set_config()` in `pg_stat_statements`), so it is refused there: 55P02,
/// with a message that never holds the value (PostgreSQL's own would).
/// Cannot raise.
unsafe extern "C-unwind" fn check_public_id_key(
    _newval: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    source: pgrx::pg_sys::GucSource::Type,
) -> bool {
    use pgrx::pg_sys::{self, GucSource::*};
    if matches!(source, PGC_S_DEFAULT | PGC_S_DYNAMIC_DEFAULT | PGC_S_FILE | PGC_S_OVERRIDE) {
        return true;
    }
    // SAFETY: the GUC check-hook protocol: an error code and palloc'd texts
    // that the caller reports at once.
    unsafe {
        pg_sys::GUC_check_errcode(pgrx::PgSqlErrorCode::ERRCODE_CANT_CHANGE_RUNTIME_PARAM as i32);
        pg_sys::GUC_check_errmsg_string =
            pg_sys::pstrdup(c"parameter \"pg_idgen.public_id_key\" can only be set in the configuration file".as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(
            c"Put it in postgresql.conf and reload. A key set with SET, set_config(), ALTER ROLE or ALTER DATABASE ... SET, a function's SET clause or a connection's options is kept where other roles read it."
                .as_ptr(),
        );
    }
    false
}

/// What `SHOW`, `current_setting()` and `set_config()` print for the
/// public-ID key, to superusers and `pg_read_all_settings` alike: never the
/// key, only whether it is set and, if valid, `id_public(0)` (which every
/// role can compute). `pg_settings` and `SHOW ALL` leave it out (their reset
/// value would show the key). Pure computation: it cannot raise.
unsafe extern "C-unwind" fn show_public_id_key() -> *const std::ffi::c_char {
    use crate::core::codec::{parse_key, Speck, B62};
    thread_local! {
        static SHOWN: std::cell::RefCell<CString> = std::cell::RefCell::new(CString::default());
    }
    let key = PUBLIC_ID_KEY.get().map(|k| k.to_string_lossy().into_owned()).filter(|k| !k.is_empty());
    let text = match key.as_deref().map(parse_key) {
        None => String::new(),
        Some(None) => "(set, not 32 hexadecimal digits)".into(),
        Some(Some(k)) => format!("(set; id_public(0) = {})", B62.encode(Speck::new(k).encrypt(0))),
    };
    SHOWN.with(|shown| {
        // The text has no NUL byte; the pointer stays valid until the next call (PostgreSQL copies it).
        *shown.borrow_mut() = CString::new(text).unwrap_or_default();
        shown.borrow().as_ptr()
    })
}

/// The public-ID key, if set. Only the preloaded library's own setting is
/// read: without the preload it is a placeholder every role can read.
pub fn public_id_key() -> Option<String> {
    if !is_preloaded() {
        IdError::PublicKeyNotPreloaded.raise()
    }
    PUBLIC_ID_KEY.get().map(|k| k.to_string_lossy().into_owned()).filter(|k| !k.is_empty())
}

/// The database that records the server's shard ownership.
pub fn fleet_database() -> String {
    FLEET_DATABASE.get().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "postgres".into())
}

/// `pg_idgen.max_databases`, fixed at server start.
pub fn max_databases() -> usize {
    MAX_DATABASES.get().max(1) as usize
}

/// Read by the planner hook, which must not panic: no thread check here.
#[inline]
pub fn rewrite_time_filters() -> bool {
    // SAFETY: as in `max_clock_lead_ms`.
    unsafe { *REWRITE_TIME_FILTERS.as_ptr() }
}

#[inline]
pub fn track_status() -> bool {
    // SAFETY: as in `max_clock_lead_ms`.
    unsafe { *TRACK_STATUS.as_ptr() }
}

#[inline]
pub fn max_clock_lead_ms() -> i64 {
    // SAFETY: reads the setting's variable directly, on the backend's one
    // thread; `GucSetting::get` would check the thread first at a cost the
    // minting path feels.
    (unsafe { *MAX_CLOCK_LEAD_MS.as_ptr() }) as i64
}
