//! What the walk carries: one planner call's `Walk`, and the query `Level`
//! being walked with the levels around it.

use std::cell::Cell;

use pgrx::pg_sys;

use super::functions::Oids;

/// One planner call's walk: our OIDs, whether the current user may execute
/// what each range adds (asked once, when first needed), and whether a range
/// was added. Lives in the hook's frame; nothing in it has a destructor.
pub(super) struct Walk {
    pub(super) oids: Oids,
    /// Per family and direction (see `Family::slot`): unknown, allowed, refused.
    pub(super) rights: [Cell<Right>; 4],
    pub(super) added: Cell<bool>,
}

#[derive(Clone, Copy, Default)]
pub(super) enum Right {
    #[default]
    Unknown,
    Allowed,
    Refused,
}

/// A query level of the walk, the level around it (what a Var's
/// `varlevelsup` counts up through; NULL at the top) and the walk. Lives in
/// `walk_query`'s frame while that level is walked.
pub(super) struct Level {
    pub(super) query: *mut pg_sys::Query,
    pub(super) up: *const Level,
    pub(super) walk: *const Walk,
}

/// The query level `n` levels around `level` (what `varlevelsup` and
/// `ctelevelsup` count), if the walk is that deep.
pub(super) fn levels_up(level: &Level, n: pg_sys::Index) -> Option<&Level> {
    let mut at = level;
    for _ in 0..n {
        // SAFETY: `up` is NULL or the enclosing level, whose frame outlives this one's.
        at = unsafe { at.up.as_ref()? };
    }
    Some(at)
}
