//! Text encodings of IDs and the public-ID cipher, in plain Rust: fixed-width,
//! order-preserving base62 and Crockford base32, and Speck64/128, the 64-bit
//! block cipher that makes public IDs.

/// Digits in ASCII order, so that the text order of fixed-width strings
/// (under the "C" collation) is their numeric order. KSUID uses the same.
pub const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Crockford's base32 alphabet (ASCII order too); ULID uses the same.
pub const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// The value of one base62 digit (`0-9A-Za-z`, case-sensitive).
pub fn base62_digit(b: u8) -> Option<u8> {
    BASE62.iter().position(|&d| d == b).map(|v| v as u8)
}

/// The value of one Crockford base32 symbol: case-insensitive, O read as 0,
/// I and L as 1; U, hyphens and anything else refused.
pub fn crockford_digit(b: u8) -> Option<u8> {
    let b = match b.to_ascii_uppercase() {
        b'O' => b'0',
        b'I' | b'L' => b'1',
        b => b,
    };
    CROCKFORD.iter().position(|&d| d == b).map(|v| v as u8)
}

/// A fixed-width positional encoding.
pub struct Encoding {
    pub name: &'static str,
    digits: &'static [u8],
    /// Enough digits for any `u64`.
    width: usize,
    /// Maps an input byte to its digit value.
    value_of: fn(u8) -> Option<u8>,
}

pub const B62: Encoding = Encoding { name: "base62 ID", digits: BASE62, width: 11, value_of: base62_digit };

pub const B32: Encoding = Encoding { name: "base32 ID", digits: CROCKFORD, width: 13, value_of: crockford_digit };

impl Encoding {
    pub fn encode(&self, mut v: u64) -> String {
        let base = self.digits.len() as u64;
        let mut out = vec![b'0'; self.width];
        for slot in out.iter_mut().rev() {
            *slot = self.digits[(v % base) as usize];
            v /= base;
        }
        // The digit tables are ASCII, so each byte is one char.
        out.into_iter().map(char::from).collect()
    }

    /// The value of fixed-width text, or None for text of another length,
    /// another alphabet, or a value past `u64`.
    pub fn decode(&self, text: &str) -> Option<u64> {
        if text.len() != self.width {
            return None;
        }
        let base = self.digits.len() as u64;
        text.bytes().try_fold(0u64, |acc, b| acc.checked_mul(base)?.checked_add(u64::from((self.value_of)(b)?)))
    }
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

#[cfg(test)]
mod tests {
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
                assert_eq!(enc.decode(&t), Some(v));
                assert!(t > prev, "{t} after {prev}");
                prev = t;
            }
        }
        assert_eq!(B62.encode(u64::MAX), "LygHa16AHYF");
        assert!(B62.decode("LygHa16AHYG").is_none(), "past u64");
        assert_eq!(B32.decode("0000000000oIl"), Some(0o1 * 32 + 1), "Crockford look-alikes");
    }

    #[test]
    fn keys_are_32_hex_digits() {
        assert_eq!(parse_key("000102030405060708090a0b0c0d0e0F"), Some(0x000102030405060708090a0b0c0d0e0f));
        assert_eq!(parse_key("00010203"), None);
        assert_eq!(parse_key("g00102030405060708090a0b0c0d0e0f"), None);
    }
}
