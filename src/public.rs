//! IDs for URLs: fixed-width, order-preserving text encodings (base62 and
//! Crockford base32), and keyed public IDs that hide time and volume: the
//! 64-bit value encrypted with Speck64/128 (a 64-bit block cipher) under
//! `pg_idgen.public_id_key`, then written in base62.

use pgrx::prelude::*;

use crate::core::codec::{parse_key, Speck, B32, B62};
use crate::errors::{IdError, OrRaise};
use crate::settings;

fn invalid(kind: &'static str, input: &str) -> IdError {
    IdError::InvalidText { kind, input: input.into() }
}

/// A non-negative ID as u64.
fn unsigned(id: i64) -> u64 {
    u64::try_from(id).map_err(|_| IdError::NegativeId(id)).or_raise()
}

/// Back to an ID: a value above the bigint range is invalid text.
fn signed(v: u64, kind: &'static str, input: &str) -> i64 {
    i64::try_from(v).map_err(|_| IdError::InvalidText { kind, input: input.into() }).or_raise()
}

/// The ID as 11 base62 digits; text order (COLLATE "C") is numeric order.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_to_base62(id: i64) -> String {
    B62.encode(unsigned(id))
}

#[pg_extern(immutable, parallel_safe, strict)]
fn id_from_base62(text: &str) -> i64 {
    signed(B62.decode(text).ok_or_else(|| invalid(B62.name, text)).or_raise(), B62.name, text)
}

/// The ID as 13 Crockford base32 digits; text order is numeric order.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_to_base32(id: i64) -> String {
    B32.encode(unsigned(id))
}

/// Crockford base32: case-insensitive, O reads as 0, I and L as 1.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_from_base32(text: &str) -> i64 {
    signed(B32.decode(text).ok_or_else(|| invalid(B32.name, text)).or_raise(), B32.name, text)
}

fn cipher() -> Speck {
    let key = settings::public_id_key().ok_or(IdError::PublicKeyMissing).or_raise();
    Speck::new(parse_key(&key).ok_or(IdError::PublicKeyInvalid).or_raise())
}

/// A public form of an ID: the ID encrypted under `pg_idgen.public_id_key`,
/// in 11 base62 digits. Neither its time nor its neighbours show.
#[pg_extern(stable, parallel_safe, strict)]
fn id_public(id: i64) -> String {
    B62.encode(cipher().encrypt(unsigned(id)))
}

/// The ID behind a public form. A public form made under another key is
/// detected when it decrypts to a negative number (half of them).
#[pg_extern(stable, parallel_safe, strict)]
fn id_from_public(text: &str) -> i64 {
    const KIND: &str = "public ID";
    let block = B62.decode(text).ok_or_else(|| invalid(KIND, text)).or_raise();
    signed(cipher().decrypt(block), KIND, text)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{key_from_file, one, sqlstate, statement_error};
    use pgrx::prelude::*;

    const KEY: &str = "00112233445566778899aabbccddeeff";

    #[pg_test]
    fn base62_and_base32_round_trip_and_keep_order() {
        assert_eq!(one::<String>("SELECT id_to_base62(0)"), "00000000000");
        assert_eq!(one::<String>("SELECT id_to_base62(9223372036854775807)"), "AzL8n0Y58m7");
        assert_eq!(one::<String>("SELECT id_to_base32(9223372036854775807)"), "7ZZZZZZZZZZZZ");
        let bad: i64 = one(
            "WITH v AS (SELECT (random() * 9223372036854775807)::bigint AS id FROM generate_series(1, 5000)
                        UNION ALL VALUES (0), (1), (9223372036854775807))
             SELECT count(*) FROM v WHERE id_from_base62(id_to_base62(id)) <> id OR id_from_base32(id_to_base32(id)) <> id",
        );
        assert_eq!(bad, 0);
        let unordered: i64 = one(
            "SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY id_to_base62(id) COLLATE \"C\") AS prev
               FROM (SELECT (random() * 9223372036854775807)::bigint AS id FROM generate_series(1, 5000)) s) t
              WHERE id < prev",
        );
        assert_eq!(unordered, 0);
    }

    #[pg_test]
    fn bad_text_is_22p02() {
        for sql in [
            "id_from_base62('0000000000')",
            "id_from_base62('000000000000')",
            "id_from_base62('0000000000-')",
            "id_from_base62('AzL8n0Y58m8')",
            "id_from_base62('LygHa16AHYG')",
            "id_from_base32('8000000000000')",
            "id_from_base32('000000000000U')",
            "id_from_public('not-public!')",
        ] {
            assert_eq!(sqlstate(sql), "22P02", "{sql}");
        }
        assert_eq!(sqlstate("id_to_base62(-1)"), "22003");
    }

    #[pg_test(error = "invalid input syntax for type base62 ID: \"0000000000-\"")]
    fn bad_text_names_the_input() {
        Spi::run("SELECT id_from_base62('0000000000-')").unwrap();
    }

    #[pg_test]
    fn public_ids_round_trip_and_look_unrelated() {
        key_from_file(KEY);
        let bad: i64 = one(
            "WITH v AS (SELECT (random() * 9223372036854775807)::bigint AS id FROM generate_series(1, 5000)
                        UNION ALL VALUES (0), (1), (9223372036854775807))
             SELECT count(*) FROM v WHERE id_from_public(id_public(id)) <> id OR length(id_public(id)) <> 11",
        );
        assert_eq!(bad, 0);
        // Consecutive IDs: no shared leading characters beyond chance.
        let shared_prefix: i64 = one(
            "SELECT count(*) FROM generate_series(1000000, 1001000) i
              WHERE left(id_public(i), 3) = left(id_public(i + 1), 3)",
        );
        assert!(shared_prefix <= 3, "{shared_prefix} of 1000 neighbours share a 3-character prefix");
    }

    #[pg_test]
    fn a_public_id_from_another_key_is_detected_when_it_decrypts_negative() {
        key_from_file(KEY);
        let publics: Vec<String> = (0..200)
            .map(|i| one::<String>(&format!("SELECT id_public({})", 1_000_000 + i)))
            .collect();
        key_from_file("ffeeddccbbaa99887766554433221100");
        let rejected = publics.iter().filter(|p| sqlstate(&format!("id_from_public('{p}')")) == "22P02").count();
        assert!((60..=140).contains(&rejected), "{rejected} of 200 rejected");
    }

    #[pg_test]
    fn the_key_is_required_valid_and_hidden() {
        assert_eq!(sqlstate("id_public(1)"), "55000");
        key_from_file("short");
        assert_eq!(sqlstate("id_public(1)"), "22023");
        assert_eq!(one::<String>("SELECT current_setting('pg_idgen.public_id_key')"), "(set, not 32 hexadecimal digits)");
        key_from_file(KEY);
        // Not even a superuser reads it back: whether it is set, and id_public(0).
        let zero = one::<String>("SELECT id_public(0)");
        assert_eq!(one::<String>("SELECT current_setting('pg_idgen.public_id_key')"), format!("(set; id_public(0) = {zero})"));
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_settings WHERE name = 'pg_idgen.public_id_key'"), 0);
        Spi::run("CREATE ROLE idgen_reader; SET ROLE idgen_reader").unwrap();
        assert_eq!(sqlstate("current_setting('pg_idgen.public_id_key')"), "42501");
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_settings WHERE name = 'pg_idgen.public_id_key'"), 0);
        // Everyone can still use it.
        assert_eq!(one::<i64>("SELECT id_from_public(id_public(42))"), 42);
        Spi::run("RESET ROLE").unwrap();
    }

    /// Only the configuration files set the key: every other way keeps the
    /// value where other roles read it, and is refused (55P02) by a message
    /// that does not hold the value; the key in force is unchanged.
    #[pg_test]
    fn the_key_is_taken_only_from_the_configuration_file() {
        key_from_file(KEY);
        let before = one::<String>("SELECT id_public(1)");
        const OTHER: &str = "ffeeddccbbaa99887766554433221100";
        for sql in [
            format!("SET pg_idgen.public_id_key = '{OTHER}'"),
            format!("SET LOCAL pg_idgen.public_id_key = '{OTHER}'"),
            format!("SELECT set_config('pg_idgen.public_id_key', '{OTHER}', false)"),
            format!("ALTER ROLE CURRENT_USER SET pg_idgen.public_id_key = '{OTHER}'"),
            format!("ALTER DATABASE pgrx_tests SET pg_idgen.public_id_key = '{OTHER}'"),
            format!("ALTER ROLE ALL SET pg_idgen.public_id_key = '{OTHER}'"),
            format!("CREATE FUNCTION pg_temp.keyed() RETURNS int LANGUAGE sql SET pg_idgen.public_id_key = '{OTHER}' AS 'SELECT 1'"),
        ] {
            let e = statement_error(&sql);
            assert!(e.starts_with("55P02: parameter \"pg_idgen.public_id_key\" can only be set in the configuration file"), "{sql}: {e}");
            assert!(!e.contains(OTHER) && e.contains("postgresql.conf"), "{sql}: {e}");
        }
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%public_id_key%'"), 0);
        assert_eq!(one::<String>("SELECT id_public(1)"), before);
        // RESET and SET ... TO DEFAULT go back to the file's value.
        assert_eq!(statement_error("RESET pg_idgen.public_id_key"), "ok");
        assert_eq!(statement_error("SET pg_idgen.public_id_key TO DEFAULT"), "ok");
    }

    #[pg_test]
    fn public_functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(proname || ':' || provolatile::text || proparallel::text, ' ' ORDER BY proname)
               FROM pg_proc WHERE proname ~ '^id_(to|from)_(base|public)|^id_public'",
        );
        assert_eq!(
            rows,
            "id_from_base32:is id_from_base62:is id_from_public:ss id_public:ss id_to_base32:is id_to_base62:is"
        );
    }
}
