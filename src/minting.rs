//! Minting a 64-bit ID of a logical shard on this server: the checks that
//! it may (writable, owned, leased), the database's mark, and the
//! generator. Where a call is minted on a Citus cluster is decided above
//! this (`crate::citus`); this only mints.

use crate::core::error::CoreError;
use crate::core::generator;
use crate::core::layout::{self, Shard, ID_TICKS, MAX_MS, SEQ_BITS};
use crate::errors::OrRaise;
use crate::mark::{self, DbReservation};
use crate::clock;
use crate::{epoch, fleet, lease, settings, shared};

/// The clock as a generator tick: epoch milliseconds, counter 0.
#[inline]
fn now_tick(epoch_ms: i64) -> Result<u64, CoreError> {
    let ms = clock::unix_us().div_euclid(1000) - epoch_ms;
    if (0..=MAX_MS).contains(&ms) {
        Ok((ms as u64) << SEQ_BITS)
    } else {
        Err(CoreError::ClockOutOfRange)
    }
}

/// Mints the next ID of a shard here, for SQL function `function`.
#[inline]
pub fn mint(shard: Shard, function: &'static str) -> i64 {
    mint_here(shard, function).or_raise()
}

#[inline]
fn mint_here(shard: Shard, function: &'static str) -> Result<i64, CoreError> {
    let state = shared::state().or_raise();
    let slot = &state.shards[shard.index()];
    mark::check_writable(function);
    fleet::check(shard).or_raise();
    // Before the reservation is loaded: a shard not leased here moves no mark.
    let leased = lease::check(&state.leases, shard).or_raise();
    let epoch_ms = epoch::for_minting();
    let reservation = DbReservation::loaded(epoch_ms);
    let lead = settings::max_clock_lead_ms();
    let minted = match leased {
        None => generator::mint(&slot.last, ID_TICKS, lead, &reservation, || now_tick(epoch_ms), clock::sleep_ms),
        Some(mark_ms) => {
            let capped = lease::Capped::new(&reservation, mark_ms - epoch_ms);
            let minted = generator::mint(&slot.last, ID_TICKS, lead, &capped, || now_tick(epoch_ms), clock::sleep_ms);
            // A mint that waited (for the clock, a lock, a WAL flush) hands
            // its ID out only if the lease still held when it was taken.
            if matches!(&minted, Ok(m) if m.waited || capped.extended.get()) {
                lease::check(&state.leases, shard).or_raise();
            }
            minted
        }
    }
    .map_err(|e| match e {
        CoreError::ClockBehind { ahead_ms, max_lead_ms, .. } => {
            CoreError::ClockBehind { shard: Some(shard.index() as i32), ahead_ms, max_lead_ms }
        }
        CoreError::ShardReleased(None) => CoreError::ShardReleased(Some(shard.index() as i32)),
        CoreError::PastLeaseMark(None) => CoreError::PastLeaseMark(Some(shard.index() as i32)),
        e => e,
    })?;
    slot.record(&minted, ID_TICKS, settings::track_status());
    Ok(layout::from_tick(minted.tick, shard))
}

