//! Sessions other nodes open here: one another node opens to mint
//! (`pg_idgen.forwarded` set at connection start) never takes a slot
//! `superuser_reserved_connections` (or, from PostgreSQL 16,
//! `reserved_connections`) keeps for administrators, whatever its role: it
//! is refused as a non-superuser would be.

use std::ffi::{c_int, c_void, CString};

use pgrx::prelude::*;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting};

use crate::errors::IdError;

/// `pg_idgen.forwarded`: how many times the call a session serves was
/// forwarded (see `route::Facts::hop`). Defined by hand, not through pgrx, for its
/// check hook.
static mut FORWARDED: c_int = 0;

/// Defines `pg_idgen.forwarded`, whether or not the library is preloaded (a
/// node whose library predates it refuses a session that sets it). Only a
/// superuser may set it, at connection start (pg_idgen connects as the
/// extension's owner): an ordinary role cannot pose as a forwarded session.
pub fn register_settings() {
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
            pg_sys::GucContext::PGC_SU_BACKEND,
            0,
            Some(admit_forwarded),
            None,
            None,
        );
    }
    register_forwarded_for();
}

/// `pg_idgen.forwarded_for`: the role a call forwarded here is made for, set
/// by the minting statement (see `libpq::mint_statement`) for the length of
/// its transaction.
static FORWARDED_FOR: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Defines `pg_idgen.forwarded_for`. Any role may set it; only a forwarded
/// session (`pg_idgen.forwarded` above 0, which only a superuser can set)
/// reads it.
fn register_forwarded_for() {
    GucRegistry::define_string_guc(
        c"pg_idgen.forwarded_for",
        c"The role a call forwarded here from another Citus node is made for.",
        c"Set by pg_idgen's minting statement in a session another node opened, so that a call it forwards once more is checked for that role; read in no other session.",
        &FORWARDED_FOR,
        GucContext::Userset,
        GucFlags::NO_SHOW_ALL,
    );
}

/// The role the call this forwarded session serves is made for; None in a
/// client's session.
pub fn forwarded_for() -> Option<String> {
    if forwarded() == 0 {
        return None;
    }
    FORWARDED_FOR.get().and_then(|role| role.into_string().ok()).filter(|role| !role.is_empty())
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
