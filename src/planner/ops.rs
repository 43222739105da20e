//! Built-in operators and functions (fixed OIDs of `pg_operator.dat` and
//! `pg_proc.dat`, checked by a test).

use pgrx::pg_sys::Oid;
pub const TSTZ_EQ: Oid = Oid::from_u32(1320);
pub const TSTZ_LT: Oid = Oid::from_u32(1322);
pub const TSTZ_LE: Oid = Oid::from_u32(1323);
pub const TSTZ_GT: Oid = Oid::from_u32(1324);
pub const TSTZ_GE: Oid = Oid::from_u32(1325);
pub const TSTZ_PL_INTERVAL: Oid = Oid::from_u32(1327);
pub const TSTZ_MI_INTERVAL: Oid = Oid::from_u32(1329);
pub const INT8_LE: Oid = Oid::from_u32(414);
pub const INT8_GE: Oid = Oid::from_u32(415);
pub const UUID_LE: Oid = Oid::from_u32(2976);
pub const UUID_GE: Oid = Oid::from_u32(2977);
/// `now()`, `transaction_timestamp()`, `statement_timestamp()`.
pub const NOW: [Oid; 3] = [Oid::from_u32(1299), Oid::from_u32(2647), Oid::from_u32(2648)];
