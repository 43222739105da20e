//! Read-only catalog queries, and the names of pg_idgen's own objects.

use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;

use crate::errors::OrRaise;

/// The first column of the first row of a read-only query; None for no row
/// or NULL. Unlike `Spi::get_one`, it never assigns a transaction ID, so it
/// also runs on a hot standby.
pub fn query_one<T: FromDatum + IntoDatum>(sql: &str, args: &[DatumWithOid<'_>]) -> Option<T> {
    Spi::connect(|c| match c.select(sql, Some(1), args).or_raise().next() {
        Some(row) => row.get::<T>(1).or_raise(),
        None => None,
    })
}

/// An object of the extension, qualified with the extension's schema and
/// quoted for use in SQL.
pub fn qualified(object: &str) -> String {
    let schema: String = query_one(
        "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pg_idgen'",
        &[],
    )
    .unwrap_or_default();
    format!("{schema}.{object}")
}
