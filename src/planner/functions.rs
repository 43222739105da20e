//! Our functions in this database (the decode functions and their clamped
//! bounds), looked up once per catalog generation and kept per backend.

use pgrx::pg_sys::{self, Oid};
use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::catalog;

use super::ops;

/// A decode function, its key type's `>=` and `<=`, and its clamped bounds.
#[derive(Clone, Copy)]
pub(super) struct Family {
    pub(super) decode: Oid,
    pub(super) key_type: Oid,
    pub(super) ge: Oid,
    pub(super) le: Oid,
    pub(super) lower: Oid,
    pub(super) upper: Oid,
    /// This family's first slot in `Walk::rights` (its lower bound; its upper is the next).
    pub(super) slot: usize,
}

/// What the walk needs: our functions in this database, if installed.
#[derive(Clone, Copy)]
pub(super) struct Oids {
    pub(super) id: Family,
    pub(super) uuid: Family,
}

/// The backend's lookup, valid for one catalog generation.
#[derive(Clone, Copy)]
enum Cache {
    Unknown,
    /// The extension is not installed in this database (or not completely).
    Absent(u64),
    Present(u64, Oids),
}

static CACHE: BackendLocal<Cache> = BackendLocal::new(Cache::Unknown);

#[repr(C)]
pub(super) struct Found {
    pub(super) present: bool,
    pub(super) oids: Oids,
}

/// Our functions in this database, looked up once per catalog generation
/// (any change to pg_proc or to a relation starts a new one) by catalog
/// APIs: no SQL, no `search_path`.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn look_up(out: *mut Found) {
    let generation = catalog::generation();
    let cache = match CACHE.get() {
        Cache::Absent(g) | Cache::Present(g, _) if g == generation => CACHE.get(),
        _ => {
            let c = match our_functions() {
                Some(oids) => Cache::Present(generation, oids),
                None => Cache::Absent(generation),
            };
            CACHE.set(c);
            c
        }
    };
    if let Cache::Present(_, oids) = cache {
        // SAFETY: `out` points at the caller's `Found`.
        unsafe { *out = Found { present: true, oids } };
    }
}

fn our_functions() -> Option<Oids> {
    let nsp = catalog::extension_schema()?;
    let tstz = [pg_sys::TIMESTAMPTZOID];
    let f = |name: &std::ffi::CStr, args: &[Oid]| catalog::function(nsp, name, args);
    Some(Oids {
        id: Family {
            decode: f(c"id_ts", &[pg_sys::INT8OID])?,
            key_type: pg_sys::INT8OID,
            ge: ops::INT8_GE,
            le: ops::INT8_LE,
            lower: f(c"id_lower_bound_clamped", &tstz)?,
            upper: f(c"id_upper_bound_clamped", &tstz)?,
            slot: 0,
        },
        uuid: Family {
            decode: f(c"uuid_v7_ts", &[pg_sys::UUIDOID])?,
            key_type: pg_sys::UUIDOID,
            ge: ops::UUID_GE,
            le: ops::UUID_LE,
            lower: f(c"uuid_v7_lower_bound_clamped", &tstz)?,
            upper: f(c"uuid_v7_upper_bound_clamped", &tstz)?,
            slot: 2,
        },
    })
}
