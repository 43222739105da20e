//! Every error pg_idgen raises, with its SQLSTATE and wording, and the one
//! function that raises them.

use pgrx::pg_sys::panic::ErrorReport;
use pgrx::{PgLogLevel, PgSqlErrorCode};

use crate::core::error::CoreError;
use crate::core::layout::{MAX_SEQ, MAX_SHARD};

/// What the ownership loader (see `fleet`) is doing, for error messages.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LoaderState {
    /// Not started yet: the server is starting, or still a standby.
    NotStarted = 0,
    Connecting = 1,
    /// Waiting for a lock on one of the ownership tables.
    WaitingForLock = 2,
    Loaded = 3,
}

/// Why a shard holds no lease, as the lease keeper (see `lease`) last saw it.
#[repr(u32)]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseWhy {
    /// Not among the shards this server asks for.
    NotAsked = 0,
    /// Asked for; the keeper has not been answered yet.
    Asking = 1,
    /// Held (once its validity has run out: not renewed in time).
    Held = 2,
    /// Another server holds its lease.
    HeldElsewhere = 3,
    /// The store cannot be reached.
    Unreachable = 4,
    /// The store let the lease expire (the server was paused or cut off).
    Lost = 5,
    /// Given back: the keeper stopped.
    Released = 6,
    /// Its mark in the store cannot be used (unreadable, another epoch).
    Refused = 7,
    /// The leader key (`pg_idgen.lease_leader_key`) names another server.
    NotLeader = 8,
}

impl LeaseWhy {
    /// The state as `shard_leases()` shows it.
    pub fn name(self) -> &'static str {
        match self {
            LeaseWhy::NotAsked => "not asked",
            LeaseWhy::Asking => "asking",
            LeaseWhy::Held => "held",
            LeaseWhy::HeldElsewhere => "held elsewhere",
            LeaseWhy::Unreachable => "store unreachable",
            LeaseWhy::Lost => "lost",
            LeaseWhy::Released => "released",
            LeaseWhy::Refused => "refused",
            LeaseWhy::NotLeader => "not leader",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdError {
    ShardOutOfRange(i32),
    SeqOutOfRange(i32),
    NegativeId(i64),
    /// A time before the epoch, past the range IDs can carry, or infinite.
    TimeOutOfRange,
    /// The same for another kind of value: a UUIDv7, or an ID of a named
    /// layout, with the first and last Unix millisecond it can carry.
    TimeOutOfRangeFor { what: String, range: Option<(i64, i64)> },
    /// The wall clock itself reads a time the layout cannot carry.
    ClockOutOfRange,
    /// Minting would put an ID's time further ahead of the clock than allowed.
    ClockBehind { shard: Option<i32>, ahead_ms: i64, max_lead_ms: i64 },
    /// A database's high-water mark (restored, upgraded, or replayed from a
    /// server whose clock was ahead) is further ahead of the clock than the
    /// lead bound: held, so that no database mints one of its IDs again.
    MarkAhead { database: String, ahead_ms: i64, max_lead_ms: i64, resumes_at: String },
    /// A database's mark set past the last millisecond IDs can carry: the
    /// commit is refused and the mark set back.
    MarkPastRange { database: String, mark_ms: i64, last: String },
    /// `id_interval` of an interval that spans no fixed, positive number of milliseconds.
    BadInterval(&'static str),
    /// An argument a function cannot take (`why`).
    BadArgument { function: &'static str, why: &'static str },
    NotPreloaded,
    /// A function of the library called where the extension is not (fully) installed.
    NotInstalled,
    /// The extension's objects here are of an older version than the library needs.
    NotUpdated(String),
    /// The shard is not (or no longer) owned by this server.
    ShardNotOwned(i32),
    /// The shard was released to another server (its shard number, once known).
    ShardReleased(Option<i32>),
    /// `shard_claim` of a shard this server released: it must be adopted.
    ShardWasReleased(i32),
    ShardRangeInvalid { first: i32, last: i32 },
    ShardsOverlap { first: i32, last: i32, held_first: i32, held_last: i32 },
    AlreadyOwned(i32),
    ForeignId { id: i64, id_shard: i32, shard: i32 },
    /// Minting in a read-only transaction (or on a hot standby).
    ReadOnly(&'static str),
    InvalidEpoch(String),
    /// A server setting whose value cannot be used (refused at server start).
    InvalidSetting { name: &'static str, why: String },
    /// With a lease store configured, a shard this server holds no valid lease on.
    LeaseNotHeld { shard: i32, why: LeaseWhy, store: String },
    /// `pg_idgen_follow_ids` fired other than AFTER ... FOR EACH ROW.
    FollowMisused(String),
    /// `pg_idgen_follow_ids` names a column the table does not have.
    FollowNoColumn(String),
    /// `pg_idgen_follow_ids` names a column that is not bigint.
    FollowNotBigint(String),
    /// A replicated ID further ahead of this server's clock than it may mint.
    FollowAhead { id: i64, ahead_ms: i64, bound_ms: i64 },
    /// A claims function called with a lease store configured.
    OwnershipFromLeases(&'static str),
    /// The next ID of a leased shard would pass the mark filed in the store.
    PastLeaseMark(Option<i32>),
    /// A layout name `id_decode(id, layout)` does not know.
    UnknownLayout(String),
    /// The current user may not change a table of ours.
    PermissionDenied(String),
    /// A statement that would queue for a lock on one of pg_idgen's
    /// relations before PostgreSQL checks ownership (kind, name).
    NotOwnerOfOurs { kind: &'static str, name: String, privilege: &'static str },
    /// The same, on a system catalog that pg_idgen reads in every session.
    SystemCatalog(String),
    /// A direct write to an ownership table by a role that is not a superuser.
    OwnershipWrittenDirectly(String),
    /// A trigger other than pg_idgen's on an ownership table ("name on table").
    ForeignTrigger(String),
    /// Ownership changes outside the fleet database.
    NotFleetDatabase(String),
    /// `pg_idgen.fleet_database` names a database that does not exist.
    FleetDatabaseMissing(String),
    /// `shard_adopt` back below this server's own release of the shard.
    AdoptBelowRelease { shard: i32, after: i64, high_water: i64 },
    /// The loader has not yet loaded the server's ownership.
    OwnershipNotLoaded { database: String, loader: LoaderState },
    /// PREPARE TRANSACTION after changing shard ownership.
    PrepareOwnership,
    /// `shard_adopt` with an ID further ahead of the clock than the lead bound.
    AdoptAhead { id: i64, ahead_ms: i64, max_lead_ms: i64 },
    /// A negative bigint given to a named layout.
    NegativeLayoutId,
    /// Text that is not an encoded ID of the given kind.
    InvalidText { kind: &'static str, input: String },
    PublicKeyMissing,
    PublicKeyInvalid,
    /// The key is read only from a preloaded library's own setting.
    PublicKeyNotPreloaded,
    /// The server's `pg_idgen.epoch` differs from the one this database's IDs were minted with.
    EpochChanged { configured_ms: i64, persisted_ms: i64 },
    SchemaMissing(String),
    /// A schema name that no schema can have: empty, or longer than NAMEDATALEN - 1 bytes.
    SchemaNameInvalid(String),
    SchemaNotRegistered(String),
    SchemaAlreadyRegistered { schema: String, shard: i32 },
    ShardTaken { shard: i32, schema: String },
    /// On a Citus worker whose metadata lists no coordinator.
    CitusNoCoordinator,
    /// On a Citus worker, a function whose state only the coordinator holds.
    CitusWorker(&'static str),
    /// A call forwarded to a node that is a Citus worker itself.
    CitusForwardedToWorker(&'static str),
    /// A call forwarded twice without reaching the node that mints it
    /// (`what`: a schema, or a node group's shard).
    CitusForwardedTwice { function: &'static str, what: String },
    /// `next_node_id()` on a node whose group has no shard of its own.
    CitusGroupWithoutShard { group: i32, groups: i32 },
    /// A node group's own shard, where Citus lists no node in that group.
    CitusNoNodeInGroup { function: &'static str, shard: i32, group: i32 },
    /// `next_node_id()` on a node in no Citus cluster's metadata.
    CitusNotInCluster(&'static str),
    /// Registering a schema at a shard a Citus node group mints with `next_node_id()`.
    CitusNodeShard { shard: i32, group: i32 },
    /// A schema's data moved again while this node took its shard over.
    CitusMovedMeanwhile { function: &'static str, schema: String },
    /// A hand-over function in a database that is no node of a Citus cluster.
    CitusNotANode(&'static str),
    /// A hand-over function that runs on workers only, called on the coordinator.
    CitusOnCoordinator(&'static str),
    /// A release asked of the node that holds the schema's data.
    CitusStillHolds { shard: i32, schema: String },
    /// The Citus node that mints (`what`) cannot be reached.
    CitusUnreachable { what: String, node: String, function: &'static str, why: String },
    /// A session another Citus node opened here, when only reserved slots are free.
    CitusReservedSlots { reserved: i32, settings: &'static str },
    /// The Citus node that mints does not let the current role execute the function.
    CitusNoExecute { function: &'static str, node: String, role: String },
    /// This server's sessions keep the most connections allowed to a node.
    CitusTooManyConnections { node: String, function: &'static str, limit: u32, waited_s: u64 },
    /// An error another Citus node raised, raised again as it was there.
    Relayed { sqlstate: String, message: String, detail: Option<String>, hint: Option<String> },
    /// A failure of pgrx's SPI layer itself (not of the SQL it ran, which
    /// PostgreSQL raises directly): a bug, reported as an internal error.
    Internal(String),
}

impl From<pgrx::spi::SpiError> for IdError {
    fn from(e: pgrx::spi::SpiError) -> Self {
        IdError::Internal(e.to_string())
    }
}

impl From<CoreError> for IdError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::ShardOutOfRange(s) => IdError::ShardOutOfRange(s),
            CoreError::SeqOutOfRange(s) => IdError::SeqOutOfRange(s),
            CoreError::NegativeId(id) => IdError::NegativeId(id),
            CoreError::TimeOutOfRange => IdError::TimeOutOfRange,
            CoreError::ClockOutOfRange => IdError::ClockOutOfRange,
            CoreError::ClockBehind { shard, ahead_ms, max_lead_ms } => IdError::ClockBehind { shard, ahead_ms, max_lead_ms },
            CoreError::ShardReleased(s) => IdError::ShardReleased(s),
            CoreError::PastLeaseMark(s) => IdError::PastLeaseMark(s),
            CoreError::BadInterval(why) => IdError::BadInterval(why),
            CoreError::Internal(m) => IdError::Internal(m),
        }
    }
}

impl IdError {
    fn code(&self) -> PgSqlErrorCode {
        use IdError::*;
        use PgSqlErrorCode::*;
        match self {
            ShardOutOfRange(_) | SeqOutOfRange(_) | NegativeId(_) => ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            TimeOutOfRange | TimeOutOfRangeFor { .. } | ClockOutOfRange | MarkPastRange { .. } => ERRCODE_DATETIME_FIELD_OVERFLOW,
            ClockBehind { .. } | MarkAhead { .. } | NotPreloaded | NotInstalled | NotUpdated(_) | ForeignTrigger(_) => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            ShardNotOwned(_) | ShardReleased(_) | ShardWasReleased(_) | AlreadyOwned(_) => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            ShardRangeInvalid { .. } | ForeignId { .. } | BadInterval(_) | BadArgument { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            ShardsOverlap { .. } => ERRCODE_UNIQUE_VIOLATION,
            ReadOnly(_) => ERRCODE_READ_ONLY_SQL_TRANSACTION,
            InvalidEpoch(_) | PublicKeyInvalid | InvalidSetting { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            LeaseNotHeld { .. } | PastLeaseMark(_) | OwnershipFromLeases(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            FollowMisused(_) => ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED,
            FollowNoColumn(_) => ERRCODE_UNDEFINED_COLUMN,
            FollowNotBigint(_) => ERRCODE_DATATYPE_MISMATCH,
            FollowAhead { .. } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            InvalidText { .. } => ERRCODE_INVALID_TEXT_REPRESENTATION,
            UnknownLayout(_) | AdoptAhead { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            NotFleetDatabase(_) | OwnershipNotLoaded { .. } | FleetDatabaseMissing(_) => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            AdoptBelowRelease { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            PrepareOwnership => ERRCODE_FEATURE_NOT_SUPPORTED,
            PermissionDenied(_) | OwnershipWrittenDirectly(_) | NotOwnerOfOurs { .. } | SystemCatalog(_) => {
                ERRCODE_INSUFFICIENT_PRIVILEGE
            }
            NegativeLayoutId => ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
            PublicKeyMissing | PublicKeyNotPreloaded | EpochChanged { .. } => ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            SchemaMissing(_) => ERRCODE_INVALID_SCHEMA_NAME,
            SchemaNameInvalid(n) if n.is_empty() => ERRCODE_INVALID_NAME,
            SchemaNameInvalid(_) => ERRCODE_NAME_TOO_LONG,
            SchemaNotRegistered(_) => ERRCODE_UNDEFINED_OBJECT,
            SchemaAlreadyRegistered { .. } | ShardTaken { .. } => ERRCODE_UNIQUE_VIOLATION,
            CitusNoCoordinator | CitusWorker(_) | CitusForwardedToWorker(_) | CitusForwardedTwice { .. } | CitusMovedMeanwhile { .. } => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            CitusNotANode(_) | CitusOnCoordinator(_) | CitusStillHolds { .. } | CitusNoNodeInGroup { .. } | CitusNotInCluster(_) => {
                ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
            }
            CitusGroupWithoutShard { .. } => ERRCODE_PROGRAM_LIMIT_EXCEEDED,
            CitusNodeShard { .. } => ERRCODE_INVALID_PARAMETER_VALUE,
            CitusUnreachable { .. } => ERRCODE_SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
            CitusReservedSlots { .. } | CitusTooManyConnections { .. } => ERRCODE_TOO_MANY_CONNECTIONS,
            CitusNoExecute { .. } => ERRCODE_INSUFFICIENT_PRIVILEGE,
            Relayed { sqlstate, .. } => sqlstate_code(sqlstate),
            Internal(_) => ERRCODE_INTERNAL_ERROR,
        }
    }

    /// (message, detail, hint)
    fn text(&self) -> (String, Option<String>, Option<String>) {
        use IdError::*;
        match self {
            ShardOutOfRange(s) => (format!("shard {s} is out of range 0 to {MAX_SHARD}"), None, None),
            SeqOutOfRange(s) => (format!("sequence number {s} is out of range 0 to {MAX_SEQ}"), None, None),
            NegativeId(id) => (
                format!("ID {id} is out of range"),
                Some("pg_idgen IDs are never negative.".into()),
                None,
            ),
            TimeOutOfRange => (
                "timestamp out of range for a pg_idgen ID".into(),
                Some("An ID carries a time from pg_idgen.epoch to 2^40 milliseconds (about 34.8 years) after it.".into()),
                None,
            ),
            TimeOutOfRangeFor { what, range } => (
                format!("timestamp out of range for {what}"),
                range.map(|(first, last)| {
                    use crate::core::layout::format_unix_ms;
                    format!("{} carries a time from {} to {}.", capitalized(what), format_unix_ms(first), format_unix_ms(last))
                }),
                None,
            ),
            ClockOutOfRange => (
                "the system clock is outside the time range of pg_idgen.epoch".into(),
                Some("An ID carries a time from pg_idgen.epoch to 2^40 milliseconds (about 34.8 years) after it.".into()),
                Some("Check the system clock and pg_idgen.epoch.".into()),
            ),
            ClockBehind { shard, ahead_ms, max_lead_ms } => (
                match shard {
                    Some(s) => format!("cannot mint an ID for shard {s}: the clock is {ahead_ms} ms behind the last ID"),
                    None => format!("cannot mint a UUID: the clock is {ahead_ms} ms behind the last UUID"),
                },
                Some(format!(
                    "pg_idgen.max_clock_lead_ms = {max_lead_ms} allows IDs at most that far ahead of the clock; \
                     an earlier ID would break ordering and uniqueness."
                )),
                Some("Wait for the clock to catch up, or raise pg_idgen.max_clock_lead_ms.".into()),
            ),
            MarkAhead { database, ahead_ms, max_lead_ms, resumes_at } => (
                format!("cannot mint: the clock is {ahead_ms} ms behind the high-water mark of database \"{database}\""),
                Some(format!(
                    "IDs and UUIDs up to that time may be stored in database \"{database}\": its mark was restored (pg_restore, pg_dumpall, \
                     pg_upgrade) or replayed from a server whose clock was ahead of this one's. No database of the server mints until \
                     every generator can be above it within pg_idgen.max_clock_lead_ms = {max_lead_ms}, so that none repeats one of them."
                )),
                Some(format!(
                    "Minting resumes at {resumes_at}. Check this server's clock; raising pg_idgen.max_clock_lead_ms (postgresql.conf, \
                     then reload) lets it mint that far ahead at once; dropping database \"{database}\" (an edited dump) releases it."
                )),
            ),
            BadArgument { function, why } => (format!("invalid argument to {function}: {why}"), None, None),
            BadInterval(why) => (
                format!("invalid interval for IDs: {why}"),
                None,
                Some("Give a fixed length such as '1 day' or '6 hours' (a day counts 24 hours).".into()),
            ),
            MarkPastRange { database, mark_ms, last } => (
                format!("cannot commit: the high-water mark set in database \"{database}\" is past the last time IDs can carry"),
                Some(format!(
                    "The mark is {mark_ms} ms after 1970; IDs of this pg_idgen.epoch carry times up to {last}: no ID is above it."
                )),
                Some("The mark was set back to this server's own. A dump restores its mark only onto a server with the same pg_idgen.epoch; never setval pg_idgen_hwm by hand.".into()),
            ),
            NotPreloaded => (
                "pg_idgen must be loaded via shared_preload_libraries to mint IDs".into(),
                None,
                Some("Add pg_idgen to shared_preload_libraries in postgresql.conf and restart the server.".into()),
            ),
            NotUpdated(version) => (
                format!("extension \"pg_idgen\" must be updated: its objects in this database are version {version}"),
                Some(format!("This function needs the objects of pg_idgen {}, which the installed library is.", env!("CARGO_PKG_VERSION"))),
                Some("Run ALTER EXTENSION pg_idgen UPDATE in this database.".into()),
            ),
            NotInstalled => (
                "extension \"pg_idgen\" is not installed in this database".into(),
                None,
                Some("Run CREATE EXTENSION pg_idgen, or ALTER EXTENSION pg_idgen UPDATE after installing a new version.".into()),
            ),
            ShardNotOwned(s) => (
                format!("shard {s} is not claimed on this server"),
                Some("This server has shard claims, and mints only for the shards it claims.".into()),
                Some(format!("Claim it with SELECT shard_claim({s}, {s}), or take it over with shard_adopt({s}, <ID returned by shard_release({s}) on its owner>).")),
            ),
            ShardReleased(s) => (
                match s {
                    Some(s) => format!("shard {s} was released to another server"),
                    None => "the shard was released to another server".into(),
                },
                None,
                Some("Mint for it on the server that adopted it.".into()),
            ),
            ShardWasReleased(s) => (
                format!("shard {s} was released from this server and cannot be claimed again"),
                None,
                Some(format!("Take it back with shard_adopt({s}, <ID returned by shard_release({s}) on its current owner>).")),
            ),
            ShardRangeInvalid { first, last } => (format!("first shard {first} is after last shard {last}"), None, None),
            ShardsOverlap { first, last, held_first, held_last } => (
                format!("shards {first} to {last} overlap the claim of shards {held_first} to {held_last} on this server"),
                None,
                None,
            ),
            AlreadyOwned(s) => (format!("shard {s} is already claimed on this server"), None, None),
            ForeignId { id, id_shard, shard } => {
                (format!("ID {id} belongs to shard {id_shard}, not to shard {shard}"), None, None)
            }
            ReadOnly(f) => (
                format!("cannot execute {f}() in a read-only transaction"),
                Some("Minting may write the persisted high-water mark, as nextval() writes its sequence.".into()),
                None,
            ),
            InvalidEpoch(v) => (
                format!("invalid value for parameter \"pg_idgen.epoch\": \"{v}\""),
                None,
                Some("Use a UTC date and time such as '2026-01-01 00:00:00+00'.".into()),
            ),
            InvalidSetting { name, why } => (format!("invalid value for parameter \"{name}\": {why}"), None, None),
            LeaseNotHeld { shard, why, store } => (
                format!("shard {shard} has no lease from the lease store"),
                Some(match why {
                    LeaseWhy::NotAsked => format!(
                        "With pg_idgen.lease_store set, this server mints only the shards it holds leases on, and it does not ask for shard {shard} (pg_idgen.lease_shards, pg_idgen.lease_auto_shards)."
                    ),
                    LeaseWhy::Asking => format!("The lease keeper has not been granted it by the store at {store} yet (if the keeper is not running, the server log says why: max_worker_processes)."),
                    LeaseWhy::Held => format!("Its lease was not renewed in time (the store at {store} did not answer); minting resumes once it is."),
                    LeaseWhy::HeldElsewhere => "Another server holds its lease; this server takes it once that lease is given back or runs out.".into(),
                    LeaseWhy::Unreachable => format!("The lease store at {store} cannot be reached; minting resumes once the lease is granted or renewed."),
                    LeaseWhy::Lost => format!("The store at {store} let its lease run out (this server was paused or cut off past the TTL); the keeper asks for it again."),
                    LeaseWhy::Released => "This server gave its lease back.".into(),
                    LeaseWhy::Refused => "Its mark in the store cannot be used (unreadable, or filed under another pg_idgen.epoch); the server log says which.".into(),
                    LeaseWhy::NotLeader => "The leader key of pg_idgen.lease_leader_key names another server: this one is not the primary its cluster elected.".into(),
                }),
                Some("SELECT * FROM shard_leases() shows the leases this server holds; its log says what the lease keeper does.".into()),
            ),
            FollowMisused(how) => (format!("trigger function pg_idgen_follow_ids() {how}"), None, None),
            FollowNoColumn(c) => (
                format!("column \"{c}\" does not exist"),
                Some("pg_idgen_follow_ids() reads the ID columns its trigger names (id when it names none).".into()),
                None,
            ),
            FollowNotBigint(c) => (
                format!("column \"{c}\" is not of type bigint"),
                Some("pg_idgen_follow_ids() follows 64-bit pg_idgen IDs.".into()),
                None,
            ),
            FollowAhead { id, ahead_ms, bound_ms } => (
                format!("replicated ID {id} is {ahead_ms} ms ahead of this server's clock"),
                Some(format!("This server mints at most {bound_ms} ms ahead of its clock (pg_idgen.max_clock_lead_ms and the mark's reserve); it does not raise its generators above this ID, and the row is not applied.")),
                Some("Check the clocks of the publisher and this subscriber, or raise pg_idgen.max_clock_lead_ms.".into()),
            ),
            OwnershipFromLeases(f) => (
                format!("{f} cannot change shard ownership on a server with a lease store"),
                Some("With pg_idgen.lease_store set, the shards this server mints are those it leases (pg_idgen.lease_shards, pg_idgen.lease_auto_shards).".into()),
                Some("Change those settings and restart; SELECT * FROM shard_leases() shows what this server holds.".into()),
            ),
            PastLeaseMark(s) => (
                match s {
                    Some(s) => format!("the next ID of shard {s} would pass the mark filed with its lease"),
                    None => "the next ID would pass the mark filed with its lease".into(),
                },
                Some("No ID minted under a lease passes the mark the server filed in the lease store; the mark moves on at each renewal (the clock may have stepped forward).".into()),
                Some("Retry in a few seconds.".into()),
            ),
            UnknownLayout(name) => (
                format!("unknown ID layout \"{name}\""),
                None,
                Some(format!(
                    "Known layouts: {}, {}.",
                    crate::core::schemes::Layout::PG_IDGEN_NAME,
                    crate::core::schemes::Layout::NAMES.join(", ")
                )),
            ),
            PermissionDenied(table) => (format!("permission denied for table {table}"), None, None),
            SystemCatalog(name) => (format!("permission denied: \"{name}\" is a system catalog"), None, None),
            NotOwnerOfOurs { kind, name, privilege } => (
                match *privilege {
                    "" => format!("must be owner of {kind} {name}"),
                    _ => format!("permission denied for {kind} {name}"),
                },
                Some(format!(
                    "{name} is pg_idgen's: who may run this statement on it{} is checked before its lock is asked for, \
                     so that waiting for that lock never makes minting wait.",
                    if privilege.is_empty() { String::new() } else { format!(" (privilege {privilege})") }
                )),
                Some("Run it as the extension's owner or a superuser.".into()),
            ),
            ForeignTrigger(trigger) => (
                format!("trigger {trigger} is not pg_idgen's"),
                Some("The ownership tables take no triggers but pg_idgen's: one would run while shard ownership is written.".into()),
                Some("Drop the trigger (and grant the shard manager INSERT, UPDATE and DELETE on the ownership tables, not ALL).".into()),
            ),
            OwnershipWrittenDirectly(table) => (
                format!("permission denied for table {table}"),
                Some("Shard ownership changes only through shard_claim, shard_release, shard_adopt and shard_own_all, \
                      which check what a change may do; only a superuser writes the table directly.".into()),
                Some("Call those functions: the INSERT and DELETE privileges on shard_ownership let a role call them.".into()),
            ),
            NotFleetDatabase(db) => (
                format!("shard ownership is recorded in database \"{db}\""),
                Some("Every database of a server mints for the same shards; pg_idgen.fleet_database names the one that records them.".into()),
                Some(format!("Connect to database \"{db}\" (with CREATE EXTENSION pg_idgen there) to claim, release or adopt shards.")),
            ),
            OwnershipNotLoaded { database, loader } => {
                use LoaderState::*;
                let doing = match loader {
                    NotStarted => "has not started yet (if the server log said \"too many background workers\" at start, \
                                   max_worker_processes left no room for it: raise it and restart)"
                        .to_string(),
                    Connecting => format!("could not connect to database \"{database}\" yet (see the server log)"),
                    WaitingForLock => format!("is waiting for a lock on an ownership table in database \"{database}\", held by another transaction"),
                    Loaded => "has just loaded it".to_string(),
                };
                (
                    "the server's shard ownership is not loaded yet".into(),
                    Some(format!("The pg_idgen loader reads it from database \"{database}\" (pg_idgen.fleet_database) after a start, crash recovery or promotion; it {doing}.")),
                    Some(format!("Retry in a moment. The server log says what the loader waits for; minting in database \"{database}\" reads the ownership directly.")),
                )
            }
            FleetDatabaseMissing(db) => (
                format!("the fleet database \"{db}\" does not exist"),
                Some("pg_idgen.fleet_database names the database that records which shards this server mints for; without it, ownership is unknown.".into()),
                Some("Set pg_idgen.fleet_database to the database with the server's shard claims (or any existing database if it never claimed), and restart.".into()),
            ),
            AdoptBelowRelease { shard, after, high_water } => (
                format!("ID {after} is below {high_water}, the ID shard {shard} was released at on this server"),
                None,
                Some(format!("Adopt it with an ID at or above {high_water}: the value shard_release returned on its last owner.")),
            ),
            PrepareOwnership => ("cannot PREPARE a transaction that changed shard ownership".into(), None, None),
            AdoptAhead { id, ahead_ms, max_lead_ms } => (
                format!("ID {id} is {ahead_ms} ms ahead of the clock"),
                Some(format!("pg_idgen.max_clock_lead_ms = {max_lead_ms}: minting above it would wait for the clock.")),
                Some("Adopt with the ID shard_release returned on a server whose clock agrees with this one, or wait.".into()),
            ),
            NegativeLayoutId => ("a negative ID carries no time in any known layout".into(), None, None),
            InvalidText { kind, input } => (format!("invalid input syntax for type {kind}: \"{}\"", shortened(input)), None, None),
            PublicKeyMissing => (
                "pg_idgen.public_id_key is not set".into(),
                None,
                Some("Set it to 32 hexadecimal digits (a 128-bit key) in postgresql.conf; only superusers can read it.".into()),
            ),
            PublicKeyInvalid => (
                "invalid value for parameter \"pg_idgen.public_id_key\"".into(),
                Some("The key must be 32 hexadecimal digits (128 bits).".into()),
                None,
            ),
            PublicKeyNotPreloaded => (
                "pg_idgen.public_id_key is read only while pg_idgen is preloaded".into(),
                Some("Without shared_preload_libraries, the setting is an unchecked placeholder that every role can read.".into()),
                Some("Add pg_idgen to shared_preload_libraries, and set the key in postgresql.conf or with ALTER SYSTEM.".into()),
            ),
            EpochChanged { configured_ms, persisted_ms } => (
                "pg_idgen.epoch differs from the epoch this database's IDs were minted with".into(),
                Some(format!(
                    "The server's epoch is {configured_ms} ms after 1970-01-01 UTC; this database's IDs count from {persisted_ms} ms. \
                     Minting under another epoch would repeat IDs and make them decode wrongly."
                )),
                Some("Set pg_idgen.epoch back to the value shown by id_epoch() in this database and restart the server.".into()),
            ),
            SchemaMissing(s) => (format!("schema \"{s}\" does not exist"), None, None),
            SchemaNameInvalid(n) if n.is_empty() => ("a schema name cannot be empty".into(), None, None),
            SchemaNameInvalid(n) => (
                format!("schema name \"{}\" is too long", shortened(n)),
                Some(format!("A name has at most {} bytes; this one has {}.", pgrx::pg_sys::NAMEDATALEN - 1, n.len())),
                Some("Use the name as PostgreSQL stores it (identifiers are truncated to that length).".into()),
            ),
            SchemaNotRegistered(s) => (
                format!("schema \"{s}\" is not registered as a pg_idgen shard"),
                None,
                Some(format!("Register it with SELECT shard_schema_register('{s}', <shard>).")),
            ),
            SchemaAlreadyRegistered { schema, shard } => {
                (format!("schema \"{schema}\" is already registered as shard {shard}"), None, None)
            }
            ShardTaken { shard, schema } => {
                (format!("shard {shard} is already registered to schema \"{schema}\""), None, None)
            }
            CitusNoCoordinator => (
                "this Citus worker knows no coordinator to mint IDs".into(),
                Some("On a Citus cluster the coordinator (node group 0) mints every logical shard no distributed schema holds, and hands the others over; pg_dist_node here lists none.".into()),
                Some("On the coordinator, run SELECT citus_set_coordinator_host('<host>', <port>).".into()),
            ),
            CitusWorker(f) => (
                format!("{f} must run on the Citus coordinator"),
                Some("On a Citus cluster the coordinator keeps the registry of schemas and the record of which node mints each shard.".into()),
                Some("Run it on the coordinator.".into()),
            ),
            CitusForwardedToWorker(f) => (
                format!("{f} was forwarded to a Citus worker as if it were the coordinator"),
                Some("This session's application_name is the one pg_idgen gives the sessions a worker opens on the coordinator, and this node is a worker: a worker's metadata names it as the coordinator (node group 0), or a client took that name.".into()),
                Some("On the coordinator, run SELECT citus_set_coordinator_host('<host>', <port>) with the coordinator's own address; a client must use another application_name.".into()),
            ),
            CitusForwardedTwice { function, what } => (
                format!("{function} for {what} was sent to a node that does not mint it"),
                Some("The nodes' metadata disagree on where the data is, as for a moment while it moves.".into()),
                Some("Retry the statement.".into()),
            ),
            CitusGroupWithoutShard { group, groups } => (
                format!("Citus node group {group} has no logical shard of its own"),
                Some(format!("Node groups 0 to {} mint shards {} down to {} with next_node_id().", groups - 1, crate::core::layout::MAX_SHARD, crate::core::layout::MAX_SHARD - groups + 1)),
                Some("On this node, key the table with next_shard_id() or next_schema_id() instead.".into()),
            ),
            CitusNoNodeInGroup { function, shard, group } => (
                format!("{function}({shard}) names the own shard of Citus node group {group}, which lists no node"),
                Some(format!("On a Citus cluster, shards 7168 to 8191 are the node groups' own, each minted only by the node of its group; Citus lists no node in group {group} here (not added yet, or removed: a removed group never mints again).")),
                Some("Key tables minted by next_shard_id with a shard below 7168.".into()),
            ),
            CitusNotInCluster(f) => (
                format!("{f} must run on a node of a Citus cluster"),
                Some("This node's Citus metadata lists no node: it was never added to a cluster, or its metadata was cleared (it then says node group 0, the coordinator's, too).".into()),
                Some("On a coordinator, run SELECT citus_set_coordinator_host('<host>', <port>); add a worker with citus_add_node on the coordinator.".into()),
            ),
            CitusNodeShard { shard, group } => (
                format!("shard {shard} is the own shard of Citus node group {group}"),
                Some(format!("On a Citus cluster, shards {} to {} are minted by the node groups with next_node_id().", crate::core::layout::MAX_SHARD - crate::core::route::NODE_GROUPS + 1, crate::core::layout::MAX_SHARD)),
                Some("Register the schema with a lower shard.".into()),
            ),
            CitusMovedMeanwhile { function, schema } => (
                format!("the data of schema \"{schema}\" moved while {function} took its shard over here"),
                Some("The node holding a distributed schema's data mints its shard; the data moved on before this node minted.".into()),
                Some("Retry the statement.".into()),
            ),
            CitusNotANode(f) => (
                format!("{f} must run on a node of a Citus cluster"),
                Some("This database has no citus extension.".into()),
                None,
            ),
            CitusOnCoordinator(f) => (
                format!("{f} must run on a Citus worker"),
                Some("The coordinator hands its own shards over itself.".into()),
                None,
            ),
            CitusStillHolds { shard, schema } => (
                format!("shard {shard} cannot be released here: this node holds the data of schema \"{schema}\""),
                Some("The node holding a distributed schema's placement mints its shard; it hands it over once the placement has moved.".into()),
                None,
            ),
            CitusUnreachable { what, node, function, why } => (
                format!("{function} cannot reach {what} at {node}"),
                Some(why.clone()),
                Some("On a Citus cluster the node holding a distributed schema mints its shard, and the coordinator every other shard: check that it runs and accepts the extension owner's connections from this node (citus.node_conninfo, pg_dist_authinfo, pg_hba.conf).".into()),
            ),
            CitusReservedSlots { reserved, settings } => (
                "remaining connection slots are reserved for administrators, not for pg_idgen's sessions from other nodes".into(),
                Some(format!("Only the {reserved} slots kept by {settings} are free; a session another node opens to mint here (pg_idgen.forwarded set) never takes them, whatever its role.")),
                Some("Raise max_connections on this node, or lower pg_idgen.citus_max_connections_per_node on the others.".into()),
            ),
            CitusNoExecute { function, node, role } => (
                format!("permission denied for function {function}"),
                Some(format!("The Citus node that mints this shard, at {node}, does not grant EXECUTE on {function} to role \"{role}\"; each node keeps its own grants.")),
                Some("Grant or revoke EXECUTE on pg_idgen's functions alike on every node of the cluster.".into()),
            ),
            CitusTooManyConnections { node, function, limit, waited_s } => (
                format!("{function} found no free connection to the Citus node at {node}"),
                Some(format!("This server's sessions keep at most {limit} connections open to that node together (pg_idgen.citus_max_connections_per_node), and none came free for this call within {waited_s} s.")),
                Some("Raise pg_idgen.citus_max_connections_per_node, or mint through the node that holds the data.".into()),
            ),
            Relayed { message, detail, hint, .. } => (message.clone(), detail.clone(), hint.clone()),
            Internal(e) => (format!("pg_idgen internal error: {e}"), None, None),
        }
    }

    /// Raises this error as a PostgreSQL ERROR. The only place pg_idgen raises.
    pub fn raise(self) -> ! {
        let (message, detail, hint) = self.text();
        let mut report = ErrorReport::new(self.code(), message, "pg_idgen");
        if let Some(d) = detail {
            report = report.set_detail(d);
        }
        if let Some(h) = hint {
            report = report.set_hint(h);
        }
        report.report(PgLogLevel::ERROR);
        unreachable!("an ERROR report does not return")
    }
}

/// A five-character SQLSTATE as PostgreSQL packs it (`MAKE_SQLSTATE`).
fn sqlstate_code(code: &str) -> PgSqlErrorCode {
    let b = code.as_bytes();
    if b.len() != 5 {
        return PgSqlErrorCode::ERRCODE_INTERNAL_ERROR;
    }
    let packed = b.iter().enumerate().fold(0i32, |acc, (i, c)| acc | ((((*c as i32) - b'0' as i32) & 0x3F) << (6 * i)));
    PgSqlErrorCode::from(packed)
}

fn capitalized(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or_else(String::new, |f| f.to_uppercase().chain(c).collect())
}

/// Input echoed in a message: at most 100 characters, so that a huge
/// argument does not become a huge log line.
fn shortened(input: &str) -> String {
    match input.char_indices().nth(100) {
        Some((cut, _)) => format!("{}...", &input[..cut]),
        None => input.to_string(),
    }
}

/// Unwraps a result, raising its error.
pub trait OrRaise<T> {
    fn or_raise(self) -> T;
}

impl<T, E: Into<IdError>> OrRaise<T> for Result<T, E> {
    #[inline]
    fn or_raise(self) -> T {
        match self {
            Ok(v) => v,
            Err(e) => e.into().raise(),
        }
    }
}
