//! The epoch IDs count from, per database.
//!
//! Generators mint with the server's `pg_idgen.epoch`, fixed at server
//! start. CREATE EXTENSION (or the update from 0.1.0) records that epoch in
//! the database (`pg_idgen_epoch`, dumped with it: a restored row replaces
//! the one the restore's CREATE EXTENSION wrote); from then on the database
//! decodes with the recorded epoch, whatever a session, a server without the
//! preload or a later configuration says, and refuses to mint IDs (55000)
//! while the server's epoch differs from it. So an IMMUTABLE decode function
//! always answers the same for the same ID.

use pgrx::prelude::*;

use crate::backend::BackendLocal;
use crate::errors::IdError;
use crate::core::layout;
use crate::{catalog, clock, settings};


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
CREATE FUNCTION pg_idgen_epoch_replaced() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM @extschema@.pg_idgen_epoch;
    RETURN NEW;
END
$$;
CREATE TRIGGER pg_idgen_epoch_replaced BEFORE INSERT ON pg_idgen_epoch
    FOR EACH ROW EXECUTE FUNCTION pg_idgen_epoch_replaced();
INSERT INTO pg_idgen_epoch (epoch_ms)
    VALUES (pg_catalog.floor(pg_catalog.date_part('epoch', @extschema@.id_epoch()) OPERATOR(pg_catalog.*) 1000)::bigint);
"#,
    name = "epoch_table",
    requires = [catalog::pg_idgen_table_changed, id_epoch]
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

/// Read without SQL: a role without USAGE on the extension's schema still decodes.
fn read() -> Option<i64> {
    catalog::first_bigint(catalog::relation(c"pg_idgen_epoch")?)
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

/// The instant this database's IDs count from: the server's `pg_idgen.epoch`
/// as recorded in the database by CREATE EXTENSION.
#[pg_extern(stable, parallel_safe, strict)]
fn id_epoch() -> TimestampWithTimeZone {
    clock::timestamptz(layout::timestamptz_of_ms(0, for_decoding()))
}
