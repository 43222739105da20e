//! Names of pg_idgen's own objects in the current database.

use pgrx::prelude::*;

use crate::errors::OrRaise;

/// An object of the extension, qualified with the extension's schema and
/// quoted for use in SQL.
pub fn qualified(object: &str) -> String {
    let schema = Spi::get_one::<String>(
        "SELECT quote_ident(extnamespace::regnamespace::text) FROM pg_extension WHERE extname = 'pg_idgen'",
    )
    .or_raise()
    .unwrap_or_default();
    format!("{schema}.{object}")
}
