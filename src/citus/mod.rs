//! Citus: each logical shard of a distributed schema is minted by the node
//! that holds the schema's data (Instagram's model), every other shard by
//! the coordinator.
//!
//! Citus evaluates a `DEFAULT next_schema_id(...)` on whichever node a
//! statement enters through, and for `INSERT ... SELECT` or `COPY` on every
//! worker holding a shard. If each node minted with its own generators, two
//! nodes would mint the same logical shard in the same millisecond. So one
//! node mints each: for a distributed schema registered as a logical shard,
//! the node holding its placement (by Citus's metadata, which every node
//! has); for any other shard, the coordinator (node group 0). A call
//! entering elsewhere is forwarded to that node by the server's forwarder
//! (see [`forwarder`]), and answers what it answered; a statement minting many
//! rows takes them in blocks (see [`Block`]). When a schema's placement
//! moves, the new holder takes the shard over before it mints (see
//! [`handover`]): its first ID is above the old holder's last.
//!
//! So a statement entering at the node holding a schema mints with no round
//! trip, and goes on when the coordinator is down; one entering elsewhere
//! costs a round trip to the holder. UUIDv7 is minted on every node (74
//! random bits).
//!
//! Without Citus in `shared_preload_libraries` nothing here runs; with it,
//! a database without the citus extension mints as a single server does.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;

mod admission;
mod forwarder;
mod handover;
mod libpq;
mod metadata;

use metadata::Addr;

use crate::backend::BackendLocal;
use crate::catalog;
use crate::core::error::CoreError;
use crate::core::layout::Shard;
use crate::errors::{IdError, OrRaise};

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
        forwarder::init();
        // SAFETY: chains the previous hook, in the postmaster before any backend starts.
        unsafe {
            PREV_ANALYZE = pg_sys::post_parse_analyze_hook;
            pg_sys::post_parse_analyze_hook = Some(statement_analyzed);
        }
    }
}

/// Defines `pg_idgen.forwarded` (see [`admission`]) and
/// `pg_idgen.citus_max_connections_per_node` (see [`forwarder`]), preloaded or not.
pub fn register_settings() {
    admission::register_settings();
    forwarder::register_settings();
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

/// What is minted for: a logical shard, or a schema's (with how to find
/// its shard in the registry, on the coordinator).
pub enum Call<'a> {
    Shard(Shard),
    Schema(&'a str, &'a dyn Fn() -> Shard),
}

impl Call<'_> {
    fn key(&self) -> Key {
        match self {
            Call::Shard(shard) => Key::Shard(shard.index()),
            Call::Schema(schema, _) => Key::Schema(schema.to_string()),
        }
    }

    /// The argument types of the function called, `function`.
    fn args(&self) -> &'static str {
        match self {
            Call::Shard(_) => "integer",
            Call::Schema(..) => "text",
        }
    }
}

/// What a block holds IDs of, and what another node is asked to mint.
#[derive(Clone, PartialEq)]
enum Key {
    Shard(usize),
    Schema(String),
}

/// The most IDs one round trip fetches: a millisecond's worth of one shard.
const MAX_BLOCK: u32 = forwarder::MAX_IDS as u32;

/// The most shards and schemas one statement keeps blocks for; past it the
/// blocks start over (bounding a backend's memory).
const MAX_BLOCKS: usize = 64;

/// IDs the minting node minted for one shard or schema in the current
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
    /// The logical shard of its IDs, once fetched.
    shard: Option<i32>,
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

/// Mints for `call` as a node of a Citus cluster: here with `here` when
/// this node mints the shard, otherwise by the node that does. None when
/// this database is not a node of a Citus cluster (it mints as a single
/// server does).
#[inline]
pub fn mint(call: Call<'_>, function: &'static str, here: impl Fn(Shard) -> Result<i64, CoreError>) -> Option<i64> {
    if !PRELOADED.load(Ordering::Relaxed) {
        return None;
    }
    let place = metadata::place()?;
    // Twice at most: once more after a hand-over showed what was read stale.
    for attempt in 0..2 {
        let route = match place.group {
            0 => on_coordinator(&call, &place, attempt > 0, function),
            _ => on_worker(&call, &place, function),
        };
        let outcome = match route {
            Route::Here(shard) => here(shard),
            Route::Forward(addr, key) => return Some(forward(&addr, key, function, call.args())),
        };
        match outcome {
            Ok(id) => return Some(id),
            Err(CoreError::ShardReleased(_)) if attempt == 0 => {
                // Another node took the shard since: read again where it is.
                metadata::forget();
                handover::forget();
            }
            Err(e) => IdError::from(e).raise(),
        }
    }
    IdError::ShardReleased(None).raise()
}

/// Where a call is minted.
enum Route {
    Here(Shard),
    /// By another node, asked for what the key names.
    Forward(Addr, Key),
}

/// On the coordinator: a schema's shard where its data is, every other
/// shard here, after taking back a shard a worker took before.
fn on_coordinator(call: &Call<'_>, place: &metadata::Place, renew: bool, function: &'static str) -> Route {
    let schema: Option<Cow<'_, str>> = match call {
        Call::Shard(shard) => metadata::registered_schema(shard.index() as i32).map(Cow::Owned),
        Call::Schema(name, _) => Some(Cow::Borrowed(*name)),
    };
    if let Some(schema) = schema {
        if let Some(holder) = metadata::holder(&schema).filter(|h| h.group != 0) {
            if libpq::hop() > 1 {
                IdError::CitusForwardedTwice { function, schema: schema.into_owned() }.raise()
            }
            return Route::Forward(holder.addr.clone(), Key::Schema(schema.into_owned()));
        }
    }
    let shard = match call {
        Call::Shard(shard) => *shard,
        Call::Schema(_, resolve) => resolve(),
    };
    // A worker took it before, or (`renew`) the coordinator's own release
    // was never recorded: the coordinator takes it back, in a session of its own.
    if renew || handover::recorded_group(shard) != 0 {
        let me = place.coordinator.as_ref().unwrap_or_else(|| IdError::CitusNoCoordinator.raise());
        handover::ask(me, handover::Ask::Back(shard, renew), function);
    }
    Route::Here(shard)
}

/// On a worker: a schema's shard here if this node holds its data (taking
/// the shard over first, if it has not), at the node that does otherwise;
/// any other shard at the coordinator, unless this node took it over for a
/// schema whose data it still holds.
fn on_worker(call: &Call<'_>, place: &metadata::Place, function: &'static str) -> Route {
    let coordinator = || place.coordinator.clone().unwrap_or_else(|| IdError::CitusNoCoordinator.raise());
    let hop = libpq::hop();
    let name = match call {
        Call::Shard(shard) => {
            // A shard this node took over for a schema whose data it still holds.
            if let Some(e) = handover::held(shard.index() as i32) {
                let here = catalog::schema_name(pg_sys::Oid::from(e.schema)).and_then(|n| metadata::holder(&n));
                if here.is_some_and(|h| h.group == place.group) {
                    return Route::Here(*shard);
                }
            }
            if hop > 0 {
                IdError::CitusForwardedToWorker(function).raise()
            }
            return Route::Forward(coordinator(), call.key());
        }
        Call::Schema(name, _) => *name,
    };
    let Some(holder) = metadata::holder(name) else {
        if hop > 0 {
            IdError::CitusForwardedToWorker(function).raise()
        }
        return Route::Forward(coordinator(), call.key());
    };
    if holder.group != place.group {
        if hop > 1 {
            IdError::CitusForwardedTwice { function, schema: name.into() }.raise()
        }
        return Route::Forward(holder.addr.clone(), call.key());
    }
    if let Some(e) = handover::held_for_schema(holder.schema) {
        return Route::Here(Shard::new(e.shard).or_raise());
    }
    // This node holds the data but has not taken the shard: the coordinator
    // hands it over. Once more, afresh, if a release here is newer than the
    // answer: either the shard moved on while the answer was on its way (the
    // coordinator then names another node), or that release was never
    // recorded (its hand-over rolled back).
    let mut renew = None;
    for _ in 0..2 {
        let taken = handover::ask(&coordinator(), handover::Ask::Schema(name, renew), function);
        if taken.group != place.group {
            break;
        }
        if handover::adopt(&taken, holder.schema) {
            return Route::Here(taken.shard);
        }
        renew = handover::released_in(taken.shard.index() as i32);
    }
    // The coordinator's metadata places the data elsewhere by now.
    metadata::forget();
    IdError::CitusMovedMeanwhile { function, schema: name.into() }.raise()
}

/// Refuses, on a Citus worker, what only the coordinator's state can hold.
pub fn refuse_on_worker(function: &'static str) {
    if PRELOADED.load(Ordering::Relaxed) && metadata::place().is_some_and(|p| p.group != 0) {
        IdError::CitusWorker(function).raise()
    }
}

/// An ID minted by the node at `addr` for `key`, from this statement's
/// block of it, fetched anew when it runs out; `function` of `args` is what
/// the caller called, which the minting node checks the caller may execute.
fn forward(addr: &Addr, key: Key, function: &'static str, args: &str) -> i64 {
    crate::mark::check_writable(function);
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
                Some(id) => return id,
                None => b.next,
            },
            None => {
                blocks.push(Block { key: key.clone(), ids: VecDeque::new(), next: 1, shard: None });
                1
            }
        }
    };
    // No borrow is held across the round trip, which may raise.
    let (schema, value) = match &key {
        Key::Shard(shard) => (false, shard.to_string()),
        Key::Schema(name) => (true, name.clone()),
    };
    let what = || match key {
        Key::Shard(_) => "the Citus coordinator".to_string(),
        Key::Schema(_) => format!("the Citus node holding schema \"{value}\""),
    };
    let mut ids: VecDeque<i64> = forwarder::mint(addr, schema, &value, n, function, &libpq::signature(function, args), &what).into();
    let first = ids.pop_front().unwrap_or_else(|| IdError::Internal("another node returned no ID".into()).raise());
    let shard = crate::core::layout::decompose(first).or_raise().shard;
    let mut blocks = BLOCKS.borrow_mut();
    for b in blocks.1.iter_mut() {
        if b.key == key {
            b.ids = std::mem::take(&mut ids);
            b.next = (n * 2).min(MAX_BLOCK);
            b.shard = Some(shard);
        } else if b.shard == Some(shard) {
            // The same shard by another call (`next_shard_id` of a schema's
            // shard beside `next_schema_id`): what that block holds is below
            // what was just fetched, so it is never handed out after it.
            b.ids.clear();
        }
    }
    first
}
