//! IDs for URLs: fixed-width, order-preserving text encodings (base62 and
//! Crockford base32), and keyed public IDs that hide time and volume: the
//! 64-bit value encrypted with Speck64/128 (a 64-bit block cipher) under
//! `pg_idgen.public_id_key`, then written in base62.

use pgrx::prelude::*;

use crate::errors::{IdError, OrRaise};
use crate::settings;

/// Digits in ASCII order, so that the text order of fixed-width strings
/// (under the "C" collation) is their numeric order.
const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Crockford's base32 alphabet (ASCII order too).
const BASE32: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// A fixed-width positional encoding.
struct Encoding {
    name: &'static str,
    digits: &'static [u8],
    /// Enough digits for any `u64`.
    width: usize,
    /// Maps an input byte to its digit value (Crockford accepts lowercase and look-alikes).
    value_of: fn(u8) -> Option<u64>,
}

const B62: Encoding = Encoding {
    name: "base62 ID",
    digits: BASE62,
    width: 11,
    value_of: |b| BASE62.iter().position(|&d| d == b).map(|v| v as u64),
};

const B32: Encoding = Encoding {
    name: "base32 ID",
    digits: BASE32,
    width: 13,
    value_of: |b| {
        let b = match b.to_ascii_uppercase() {
            b'O' => b'0',
            b'I' | b'L' => b'1',
            b => b,
        };
        BASE32.iter().position(|&d| d == b).map(|v| v as u64)
    },
};

impl Encoding {
    fn encode(&self, mut v: u64) -> String {
        let base = self.digits.len() as u64;
        let mut out = vec![b'0'; self.width];
        for slot in out.iter_mut().rev() {
            *slot = self.digits[(v % base) as usize];
            v /= base;
        }
        // The digit tables are ASCII, so each byte is one char.
        out.into_iter().map(char::from).collect()
    }

    fn decode(&self, text: &str) -> Result<u64, IdError> {
        let bad = || IdError::InvalidText { kind: self.name, input: text.into() };
        if text.len() != self.width {
            return Err(bad());
        }
        let base = self.digits.len() as u64;
        text.bytes().try_fold(0u64, |acc, b| {
            let d = (self.value_of)(b).ok_or_else(bad)?;
            acc.checked_mul(base).and_then(|a| a.checked_add(d)).ok_or_else(bad)
        })
    }
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
    signed(B62.decode(text).or_raise(), B62.name, text)
}

/// The ID as 13 Crockford base32 digits; text order is numeric order.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_to_base32(id: i64) -> String {
    B32.encode(unsigned(id))
}

/// Crockford base32: case-insensitive, O reads as 0, I and L as 1.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_from_base32(text: &str) -> i64 {
    signed(B32.decode(text).or_raise(), B32.name, text)
}

/// Speck64/128: 27 rounds on two 32-bit words under a 128-bit key.
pub struct Speck {
    round_keys: [u32; 27],
}

impl Speck {
    pub fn new(key: u128) -> Speck {
        let mut k = [0u32; 27];
        let mut l = [0u32; 29];
        k[0] = key as u32;
        for (i, w) in l.iter_mut().take(3).enumerate() {
            *w = (key >> (32 * (i + 1))) as u32;
        }
        for i in 0..26 {
            l[i + 3] = k[i].wrapping_add(l[i].rotate_right(8)) ^ i as u32;
            k[i + 1] = k[i].rotate_left(3) ^ l[i + 3];
        }
        Speck { round_keys: k }
    }

    pub fn encrypt(&self, block: u64) -> u64 {
        let (mut x, mut y) = ((block >> 32) as u32, block as u32);
        for &k in &self.round_keys {
            x = x.rotate_right(8).wrapping_add(y) ^ k;
            y = y.rotate_left(3) ^ x;
        }
        (x as u64) << 32 | y as u64
    }

    pub fn decrypt(&self, block: u64) -> u64 {
        let (mut x, mut y) = ((block >> 32) as u32, block as u32);
        for &k in self.round_keys.iter().rev() {
            y = (y ^ x).rotate_right(3);
            x = ((x ^ k).wrapping_sub(y)).rotate_left(8);
        }
        (x as u64) << 32 | y as u64
    }
}

/// Parses the key setting: 32 hexadecimal digits (128 bits).
pub fn parse_key(text: &str) -> Option<u128> {
    (text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit())).then(|| u128::from_str_radix(text, 16).ok())?
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
    let block = B62.decode(text).map_err(|_| IdError::InvalidText { kind: KIND, input: text.into() }).or_raise();
    signed(cipher().decrypt(block), KIND, text)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn speck64_128_matches_the_published_test_vector() {
        // Key 1b1a1918 13121110 0b0a0908 03020100, plaintext 3b726574 7475432d.
        let s = Speck::new(0x1b1a1918_13121110_0b0a0908_03020100);
        assert_eq!(s.encrypt(0x3b726574_7475432d), 0x8c6fa548_454e028b);
        assert_eq!(s.decrypt(0x8c6fa548_454e028b), 0x3b726574_7475432d);
    }

    #[test]
    fn flipping_one_input_bit_flips_about_half_the_output_bits() {
        let s = Speck::new(0x0123456789abcdef_fedcba9876543210);
        let (mut flipped, mut total) = (0u64, 0u64);
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..2000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let id = x >> 1;
            let c = s.encrypt(id);
            for bit in 0..63 {
                flipped += (c ^ s.encrypt(id ^ (1 << bit))).count_ones() as u64;
                total += 64;
            }
        }
        let ratio = flipped as f64 / total as f64;
        assert!((0.49..0.51).contains(&ratio), "{ratio}");
    }

    #[test]
    fn encodings_round_trip_and_keep_order() {
        for enc in [&B62, &B32] {
            let mut prev = String::new();
            for v in [0, 1, 61, 62, 1 << 40, i64::MAX as u64 - 1, i64::MAX as u64, u64::MAX] {
                let t = enc.encode(v);
                assert_eq!(t.len(), enc.width);
                assert_eq!(enc.decode(&t), Ok(v));
                assert!(t > prev, "{t} after {prev}");
                prev = t;
            }
        }
        assert_eq!(B62.encode(u64::MAX), "LygHa16AHYF");
        assert!(B62.decode("LygHa16AHYG").is_err(), "past u64");
        assert_eq!(B32.decode("0000000000oIl"), Ok(0o1 * 32 + 1), "Crockford look-alikes");
    }

    #[test]
    fn keys_are_32_hex_digits() {
        assert_eq!(parse_key("000102030405060708090a0b0c0d0e0F"), Some(0x000102030405060708090a0b0c0d0e0f));
        assert_eq!(parse_key("00010203"), None);
        assert_eq!(parse_key("g00102030405060708090a0b0c0d0e0f"), None);
    }
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    const KEY: &str = "SET pg_idgen.public_id_key = '00112233445566778899aabbccddeeff'";

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
        Spi::run(KEY).unwrap();
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
        Spi::run(KEY).unwrap();
        let publics: Vec<String> = (0..200)
            .map(|i| one::<String>(&format!("SELECT id_public({})", 1_000_000 + i)))
            .collect();
        Spi::run("SET pg_idgen.public_id_key = 'ffeeddccbbaa99887766554433221100'").unwrap();
        let rejected = publics.iter().filter(|p| sqlstate(&format!("id_from_public('{p}')")) == "22P02").count();
        assert!((60..=140).contains(&rejected), "{rejected} of 200 rejected");
    }

    #[pg_test]
    fn the_key_is_required_valid_and_hidden() {
        assert_eq!(sqlstate("id_public(1)"), "55000");
        Spi::run("SET pg_idgen.public_id_key = 'short'").unwrap();
        assert_eq!(sqlstate("id_public(1)"), "22023");
        Spi::run(KEY).unwrap();
        Spi::run("CREATE ROLE idgen_reader; SET ROLE idgen_reader").unwrap();
        assert_eq!(sqlstate("current_setting('pg_idgen.public_id_key')"), "42501");
        assert_eq!(one::<i64>("SELECT count(*) FROM pg_settings WHERE name = 'pg_idgen.public_id_key'"), 0);
        // Everyone can still use it.
        assert_eq!(one::<i64>("SELECT id_from_public(id_public(42))"), 42);
        Spi::run("RESET ROLE").unwrap();
        assert_eq!(sqlstate("set_config('pg_idgen.public_id_key', '00112233445566778899aabbccddeeff', false)"), "ok");
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
