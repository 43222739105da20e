//! The core's own errors. The SQL glue (`crate::errors`) maps each to a
//! SQLSTATE and PostgreSQL's wording.

/// What the layouts and generators can refuse.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreError {
    ShardOutOfRange(i32),
    SeqOutOfRange(i32),
    NegativeId(i64),
    /// A time before the epoch, past the range IDs can carry, or infinite.
    TimeOutOfRange,
    /// The wall clock itself reads a time the layout cannot carry.
    ClockOutOfRange,
    /// Minting would put a value's time further ahead of the clock than allowed.
    ClockBehind { shard: Option<i32>, ahead_ms: i64, max_lead_ms: i64 },
    /// The generator's shard was released to another server.
    ShardReleased(Option<i32>),
    /// The next value would pass the mark filed with the shard's lease.
    PastLeaseMark(Option<i32>),
    /// An interval that spans no fixed, positive number of milliseconds.
    BadInterval(&'static str),
    /// A broken invariant: a bug, reported as an internal error.
    Internal(String),
}
