//! The RFC 9562 version-7 layout, in plain Rust.
//!
//! ```text
//!  48-bit Unix ms | ver 0111 | 12-bit rand_a | var 10 | 62-bit rand_b
//! ```
//! rand_a holds a 12-bit sub-millisecond fraction of the clock, counting up
//! from there when values come faster than the clock (RFC 9562 section 6.2,
//! methods 3 and 1 together): `ms << 12 | rand_a` is a generator tick.

use super::error::CoreError;
use super::generator::TickFormat;

pub const RAND_A_BITS: u32 = 12;
pub const UUID_TICKS: TickFormat = TickFormat { bits: RAND_A_BITS, max_ms: (1 << 48) - 1 };

/// The tick of a Unix time in microseconds: ms and a 12-bit fraction of it.
pub fn tick_of_unix_us(us: i64) -> Result<u64, CoreError> {
    let ms = us.div_euclid(1000);
    if !(0..=UUID_TICKS.max_ms).contains(&ms) {
        return Err(CoreError::TimeOutOfRange);
    }
    let fraction = (us.rem_euclid(1000) << RAND_A_BITS) / 1000;
    Ok(((ms as u64) << RAND_A_BITS) | fraction as u64)
}

/// The UUID bytes of a tick and 62 random bits (the top two of `rand` are
/// replaced by the variant).
pub fn bytes_of_tick(tick: u64, rand: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    let ms = tick >> RAND_A_BITS;
    let rand_a = tick & 0xfff;
    b[..8].copy_from_slice(&((ms << 16) | 0x7000 | rand_a).to_be_bytes());
    b[8..].copy_from_slice(&((rand & (u64::MAX >> 2)) | (1 << 63)).to_be_bytes());
    b
}

/// The smallest UUID of a tick's millisecond, and the largest.
pub fn bounds_of_tick(tick: u64) -> ([u8; 16], [u8; 16]) {
    (bytes_of_tick(tick >> RAND_A_BITS << RAND_A_BITS, 0), bytes_of_tick(tick | 0xfff, u64::MAX))
}

/// The Unix millisecond of a version-7 UUID with the RFC 9562 variant, or None.
pub fn unix_ms(b: &[u8; 16]) -> Option<i64> {
    if b[6] >> 4 != 7 || b[8] >> 6 != 0b10 {
        return None;
    }
    Some(b[..6].iter().fold(0i64, |acc, &x| (acc << 8) | x as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_carry_ms_and_a_fraction() {
        assert_eq!(tick_of_unix_us(1_500), Ok((1 << 12) | 2048));
        assert_eq!(tick_of_unix_us(999), Ok(4091));
        assert_eq!(tick_of_unix_us(-1), Err(CoreError::TimeOutOfRange));
        assert_eq!(tick_of_unix_us(((1 << 48) - 1) * 1000 + 999), Ok(((1 << 48) - 1) << 12 | 4091));
        assert_eq!(tick_of_unix_us((1 << 48) * 1000), Err(CoreError::TimeOutOfRange));
    }

    #[test]
    fn version_variant_and_time_round_trip() {
        let tick = tick_of_unix_us(1_623_053_350_123_456).unwrap();
        let b = bytes_of_tick(tick, u64::MAX);
        assert_eq!(b[6] >> 4, 7);
        assert_eq!(b[8] >> 6, 0b10);
        assert_eq!(unix_ms(&b), Some(1_623_053_350_123));
        let (lo, hi) = bounds_of_tick(tick);
        assert!(lo <= b && b <= hi);
        assert_eq!(unix_ms(&[0; 16]), None);
    }
}
