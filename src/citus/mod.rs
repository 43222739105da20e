//! Citus: each node mints its node group's own logical shard
//! (`next_node_id()`), the node holding a distributed schema's data mints
//! the schema's shard (Instagram's model), the coordinator every other.
//!
//! Citus evaluates a `DEFAULT next_schema_id(...)` on whichever node a
//! statement enters through, and for `INSERT ... SELECT` or `COPY` on every
//! worker holding a shard. If each node minted with its own generators, two
//! nodes would mint the same logical shard in the same millisecond. So one
//! node mints each, as [`route::decide`] says from what this node knows
//! (Citus's metadata, which every node has, and the hand-over record). A
//! call entering elsewhere is sent to that node over the session's own
//! connection (see [`libpq`]), and answers what it answered; a statement minting
//! many rows takes them in blocks (see `core::blocks`). When a schema's
//! placement moves, the new holder takes the shard over before it mints
//! (see [`handover`]): its first ID is above the old holder's last.
//!
//! So a statement entering at the node that mints its shard makes no round
//! trip, and goes on when the coordinator is down; one entering elsewhere
//! costs a round trip to that node. UUIDv7 is minted on every node (62
//! random bits).
//!
//! Without Citus in `shared_preload_libraries` nothing here runs; with it,
//! a database without the citus extension mints as a single server does.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use pgrx::prelude::*;

mod admission;
mod handover;
mod libpq;
mod metadata;
mod registry;

use std::rc::Rc;

use metadata::Addr;

use crate::backend::BackendLocal;
use crate::catalog;
use crate::core::blocks::Blocks;
use crate::core::layout::Shard;
use crate::core::route::{self, Decision, Facts, Node, Refusal};
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
        libpq::init();
        // SAFETY: chains the previous hook, in the postmaster before any backend starts.
        unsafe {
            PREV_ANALYZE = pg_sys::post_parse_analyze_hook;
            pg_sys::post_parse_analyze_hook = Some(statement_analyzed);
        }
    }
}

/// Defines `pg_idgen.forwarded` (see [`admission`]) and
/// `pg_idgen.citus_max_connections_per_node` (see [`libpq`]), preloaded or not.
pub fn register_settings() {
    admission::register_settings();
    libpq::register_settings();
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

/// What is minted for: this node group's own shard, a logical shard, or
/// a schema's.
pub enum Call<'a> {
    Node,
    Shard(Shard),
    Schema(&'a str),
}

impl Call<'_> {
    /// The argument types of the function called, `function`.
    fn args(&self) -> &'static str {
        match self {
            Call::Node => "",
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

/// The statement the blocks belong to: the client's command (by its start
/// time, a new one at every protocol message), the statements analyzed
/// before it (a new one for each statement of a query string: they share a
/// start time), and the current role (a block fetched as one role is not
/// handed to another). A statement that ends, fails or is followed by
/// another leaves its blocks behind, also where a call outlives it (a
/// PL/pgSQL expression's lives as long as its transaction, a cursor's until
/// it is closed).
type Statement = (pg_sys::TimestampTz, u64, pg_sys::Oid);

static BLOCKS: BackendLocal<Blocks<Statement, Key>> = BackendLocal::new(Blocks::new());

/// Where a call is minted on a Citus cluster.
pub enum Routed {
    /// Here, for this shard (taken over or back first, if it had to be).
    Here(Shard),
    /// By another node, which answered this ID.
    Minted(i64),
}

/// Routes `call` as a node of a Citus cluster, as [`route::decide`] says:
/// what to mint here, or the ID the node that mints it answered. None when
/// this database is not a node of a Citus cluster (it mints as a single
/// server does).
#[inline]
pub fn route(call: Call<'_>, function: &'static str) -> Option<Routed> {
    if !PRELOADED.load(Ordering::Relaxed) {
        return None;
    }
    let place = metadata::place()?;
    // Twice at most: the decision asks to read again only what was read
    // before a release it sees, and never after.
    for fresh in [false, true] {
        let seen = Seen::gather(&call, &place, fresh);
        let what = match &call {
            Call::Node => route::Call::Node,
            Call::Shard(shard) => route::Call::Shard(shard.index() as i32),
            Call::Schema(..) => route::Call::Schema,
        };
        return Some(match route::decide(what, seen.facts) {
            Decision::Here => Routed::Here(seen.shard(&call, &place)),
            Decision::TakeBack { renew } => {
                let shard = seen.shard(&call, &place);
                let me = place.coordinator.as_ref().unwrap_or_else(|| IdError::CitusNoCoordinator.raise());
                handover::ask(me, handover::Ask::Back(shard, renew), function);
                Routed::Here(shard)
            }
            Decision::TakeOver => Routed::Here(take_over(&call, &seen, &place, function)),
            Decision::Send(node) => Routed::Minted(send(&call, &seen, &place, node, function)),
            Decision::Reread => {
                metadata::forget();
                handover::forget();
                continue;
            }
            Decision::Refuse(why) => refuse(why, &call, &seen, function),
        });
    }
    IdError::Internal("the Citus routing asked to read the metadata again twice".into()).raise()
}

/// What this node knows about a call: the decision's facts, and what
/// acting on them needs (the schema's name and holder, the shard).
struct Seen {
    facts: Facts,
    schema: Option<String>,
    holder: Option<Rc<metadata::Holder>>,
    shard: Option<Shard>,
}

impl Seen {
    fn gather(call: &Call<'_>, place: &metadata::Place, fresh: bool) -> Seen {
        let mut seen = Seen {
            facts: Facts {
                group: place.group,
                hop: admission::forwarded(),
                fresh,
                node_shards: metadata::node_shards(),
                in_cluster: place.in_cluster,
                ..Facts::default()
            },
            schema: None,
            holder: None,
            shard: None,
        };
        let asked = match call {
            Call::Node => return seen,
            Call::Shard(shard) => *shard,
            Call::Schema(name) => {
                seen.schema = Some((*name).to_string());
                seen.holder = metadata::holder(name);
                seen.facts.holder = seen.holder.as_ref().map(|h| h.group);
                if seen.facts.holder.is_some_and(|g| g != place.group) {
                    return seen;
                }
                match (place.group, &seen.holder) {
                    // The coordinator: the registry's shard.
                    (0, _) => crate::schema_shards::shard_of(name),
                    // A worker holding the data: the shard it took for the schema, if it did.
                    (_, Some(h)) => match handover::held_for_schema(h.schema) {
                        Some(e) => Shard::new(e.shard).or_raise(),
                        None => return seen,
                    },
                    // A worker that does not know: the coordinator does.
                    (_, None) => return seen,
                }
            }
        };
        let index = asked.index() as i32;
        if let Call::Schema(..) = call {
            seen.facts.shard = Some(index);
        }
        if let (Call::Shard(_), Some(group), true) = (call, route::node_group_of(index), seen.facts.node_shards) {
            seen.facts.group_listed = group == place.group || metadata::node_of_group(group).is_some();
            seen.shard = Some(asked);
            return seen;
        }
        // A worker's own hand-over record of the shard, read once.
        let held = if place.group == 0 { None } else { handover::held(index) };
        if let Call::Shard(_) = call {
            // The schema of the shard, where this node knows it: the
            // registry on the coordinator, a worker's own hand-over record.
            seen.schema = held
                .as_ref()
                .and_then(|e| catalog::schema_name(pg_sys::Oid::from(e.schema)))
                .or_else(|| metadata::registered_schema(index));
            seen.holder = seen.schema.as_deref().and_then(metadata::holder);
            seen.facts.holder = seen.holder.as_ref().map(|h| h.group);
        }
        seen.facts.taken_here = place.group != 0 && seen.facts.holder == Some(place.group) && held.is_some();
        seen.facts.recorded = if place.group == 0 { handover::recorded_group(asked) } else { 0 };
        seen.facts.released_here = crate::shared::state().or_raise().shards[asked.index()].last.load(Ordering::Acquire)
            == crate::core::generator::RETIRED;
        seen.shard = Some(asked);
        seen
    }

    /// The shard to mint here.
    fn shard(&self, call: &Call<'_>, place: &metadata::Place) -> Shard {
        match (call, self.shard) {
            (_, Some(shard)) => shard,
            (Call::Node, None) => Shard::new(route::node_shard(place.group).unwrap_or(-1)).or_raise(),
            _ => IdError::Internal("the Citus routing chose to mint a shard it did not know".into()).raise(),
        }
    }
}

/// On a worker holding a schema's data: has the coordinator hand its shard
/// over, and returns it. Once more, afresh, if a release here is newer
/// than the answer: either the shard moved on while the answer was on its
/// way (the coordinator then names another node), or that release was
/// never recorded (its hand-over rolled back).
fn take_over(call: &Call<'_>, seen: &Seen, place: &metadata::Place, function: &'static str) -> Shard {
    let (Some(name), Some(holder)) = (seen.schema.as_deref(), seen.holder.as_ref()) else {
        IdError::Internal("the Citus routing chose a hand-over with no schema".into()).raise()
    };
    let coordinator = place.coordinator.as_ref().unwrap_or_else(|| IdError::CitusNoCoordinator.raise());
    let mut renew = None;
    for _ in 0..2 {
        let taken = handover::ask(coordinator, handover::Ask::Schema(name, renew), function);
        if taken.group != place.group {
            break;
        }
        if handover::adopt(&taken, holder.schema) {
            // A shard asked for by number that the registry no longer gives this schema.
            if matches!(call, Call::Shard(s) if *s != taken.shard) {
                break;
            }
            return taken.shard;
        }
        renew = handover::released_in(taken.shard.index() as i32);
    }
    // The coordinator's metadata places the data elsewhere by now.
    metadata::forget();
    IdError::CitusMovedMeanwhile { function, schema: name.into() }.raise()
}

/// Sends the call to `node` and returns the ID it minted. A worker's copy
/// of the registry may be older than the coordinator's: an ID of another
/// shard for `next_shard_id` is not handed out, and the coordinator, which
/// knows, is asked instead.
fn send(call: &Call<'_>, seen: &Seen, place: &metadata::Place, node: Node, function: &'static str) -> i64 {
    let id = send_once(call, seen, place, node, function);
    match call {
        Call::Shard(shard) if node == Node::Holder && crate::core::layout::decompose(id).or_raise().shard != shard.index() as i32 => {
            if place.group == 0 {
                metadata::forget();
                IdError::CitusMovedMeanwhile { function, schema: seen.schema.clone().unwrap_or_default() }.raise()
            }
            send_once(call, seen, place, Node::Coordinator, function)
        }
        _ => id,
    }
}

fn send_once(call: &Call<'_>, seen: &Seen, place: &metadata::Place, node: Node, function: &'static str) -> i64 {
    let (addr, key, what) = match node {
        Node::Coordinator => {
            let addr = place.coordinator.clone().unwrap_or_else(|| IdError::CitusNoCoordinator.raise());
            let key = match (call, &seen.schema) {
                (Call::Shard(shard), _) => Key::Shard(shard.index()),
                (_, Some(name)) => Key::Schema(name.clone()),
                _ => IdError::Internal("the Citus routing sent a call it cannot name".into()).raise(),
            };
            (addr, key, "the Citus coordinator".to_string())
        }
        Node::Holder => {
            let (Some(name), Some(holder)) = (&seen.schema, &seen.holder) else {
                IdError::Internal("the Citus routing sent a call to no holder".into()).raise()
            };
            (holder.addr.clone(), Key::Schema(name.clone()), format!("the Citus node holding schema \"{name}\""))
        }
        Node::Group(group) => {
            let shard = seen.shard(call, place);
            let addr = metadata::node_of_group(group).unwrap_or_else(|| refuse(Refusal::NoNodeInGroup(group), call, seen, function));
            (addr, Key::Shard(shard.index()), format!("the Citus node of group {group}"))
        }
    };
    forward(&addr, key, function, call.args(), &what)
}

/// Raises the error a refusal names.
fn refuse(why: Refusal, call: &Call<'_>, seen: &Seen, function: &'static str) -> ! {
    let shard = || seen.shard.map_or(-1, |s| s.index() as i32);
    match why {
        Refusal::Misrouted => IdError::CitusForwardedTwice {
            function,
            what: match (&seen.schema, call) {
                (Some(name), _) => format!("schema \"{name}\""),
                _ => format!("shard {}", shard()),
            },
        }
        .raise(),
        Refusal::WorkerAsCoordinator => IdError::CitusForwardedToWorker(function).raise(),
        Refusal::GroupWithoutShard(group) => IdError::CitusGroupWithoutShard { group, groups: route::NODE_GROUPS }.raise(),
        Refusal::NoNodeInGroup(group) => IdError::CitusNoNodeInGroup { function, shard: shard(), group }.raise(),
        Refusal::NotInCluster => IdError::CitusNotInCluster(function).raise(),
        Refusal::SchemaAtNodeShard(shard) => {
            IdError::CitusNodeShard { shard, group: route::node_group_of(shard).unwrap_or_default() }.raise()
        }
    }
}

/// Refuses, on a Citus worker, what only the coordinator's state can hold.
pub fn refuse_on_worker(function: &'static str) {
    if PRELOADED.load(Ordering::Relaxed) && metadata::place().is_some_and(|p| p.group != 0) {
        IdError::CitusWorker(function).raise()
    }
}

/// On the coordinator, after a registration: sends the registry to every
/// worker (see [`registry`]).
pub fn registered(function: &'static str) {
    if PRELOADED.load(Ordering::Relaxed) && metadata::place().is_some_and(|p| p.group == 0) {
        registry::push(function);
    }
}

/// Refuses, on a Citus cluster, to register a schema at a shard a node
/// group mints with `next_node_id()`.
pub fn refuse_node_shard(shard: Shard) {
    if PRELOADED.load(Ordering::Relaxed) && metadata::place().is_some() {
        if let Some(group) = route::node_group_of(shard.index() as i32) {
            IdError::CitusNodeShard { shard: shard.index() as i32, group }.raise()
        }
    }
}

/// An ID minted by the node at `addr` for `key`, from this statement's
/// block of it, fetched anew when it runs out; `function` of `args` is what
/// the caller called, which the minting node checks the caller may execute.
fn forward(addr: &Addr, key: Key, function: &'static str, args: &str, what: &str) -> i64 {
    crate::mark::check_writable(function);
    // SAFETY: reads the current command's start time and the current role.
    let statement = unsafe { (pg_sys::GetCurrentStatementStartTimestamp(), ANALYZED.load(Ordering::Relaxed), pg_sys::GetUserId()) };
    let n = match BLOCKS.borrow_mut().take(statement, &key) {
        Ok(id) => return id,
        Err(n) => n,
    };
    // No borrow is held across the round trip, which may raise.
    let (schema, value) = match &key {
        Key::Shard(shard) => (false, shard.to_string()),
        Key::Schema(name) => (true, name.clone()),
    };
    let what = || what.to_string();
    let mut ids: VecDeque<i64> = libpq::mint(addr, schema, &value, n, function, &libpq::signature(function, args), &what).into();
    let first = ids.pop_front().unwrap_or_else(|| IdError::Internal("another node returned no ID".into()).raise());
    let shard = crate::core::layout::decompose(first).or_raise().shard;
    BLOCKS.borrow_mut().fill(&key, ids, n, shard);
    first
}
