//! The epoch IDs count from, per database.
//!
//! Generators mint with the server's `pg_idgen.epoch`, fixed at server
//! start. The first mark written in a database after a start records that
//! epoch in the database (`pg_idgen_epoch`, dumped with it); from then on
//! the database decodes with the recorded epoch, whatever a session, a
//! server without the preload or a later configuration says, and refuses to
//! mint IDs (55000) while the server's epoch differs from it. So an
//! IMMUTABLE decode function always answers the same for the same ID.

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::errors::IdError;
use crate::{catalog, settings};

const TABLE: &str = "pg_idgen_epoch";

extension_sql!(
    r#"
CREATE TABLE pg_idgen_epoch (
    epoch_ms bigint NOT NULL,
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton)
);
COMMENT ON TABLE pg_idgen_epoch IS
    'pg_idgen: the epoch (Unix ms) this database''s IDs were minted with (do not change)';
GRANT SELECT ON pg_idgen_epoch TO PUBLIC;
CREATE TRIGGER pg_idgen_epoch_changed
    AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON pg_idgen_epoch
    FOR EACH STATEMENT EXECUTE FUNCTION pg_idgen_table_changed();
SELECT pg_catalog.pg_extension_config_dump('pg_idgen_epoch', '');
"#,
    name = "epoch_table",
    requires = [catalog::pg_idgen_table_changed]
);

/// The recorded epoch of this database, cached per catalog generation.
fn recorded() -> Option<i64> {
    static CACHE: BackendLocal<(u64, Option<i64>)> = BackendLocal::new((0, None));
    let generation = catalog::generation();
    let (seen, epoch) = CACHE.get();
    if seen == generation {
        return epoch;
    }
    let epoch = read();
    CACHE.set((generation, epoch));
    epoch
}

fn read() -> Option<i64> {
    catalog::relation(c"pg_idgen_epoch")?;
    catalog::query_one(&format!("SELECT epoch_ms FROM {}", catalog::qualified(TABLE)), &[])
}

/// The epoch (Unix ms) to decode and build IDs with in this database: the
/// recorded one, or the server's before anything was minted here.
#[inline]
pub fn for_decoding() -> i64 {
    recorded().unwrap_or_else(settings::configured_epoch_ms)
}

/// The epoch to mint IDs with: the server's, refused when this database
/// recorded another.
#[inline]
pub fn for_minting() -> i64 {
    let configured = settings::configured_epoch_ms();
    match recorded() {
        Some(persisted_ms) if persisted_ms != configured => {
            IdError::EpochChanged { configured_ms: configured, persisted_ms }.raise()
        }
        _ => configured,
    }
}

/// Records the server's epoch in this database unless one is recorded.
/// Called with every write of the mark (as the superuser), so that a
/// recording rolled back with its transaction is made again.
pub fn record_if_missing() {
    if recorded().is_some() || catalog::relation(c"pg_idgen_epoch").is_none() {
        return; // recorded, or the 0.1.0 schema before ALTER EXTENSION UPDATE
    }
    catalog::run(
        &format!("INSERT INTO {} (epoch_ms) VALUES ($1) ON CONFLICT DO NOTHING", catalog::qualified(TABLE)),
        &[settings::configured_epoch_ms().into()],
    );
}
