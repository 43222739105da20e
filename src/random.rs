//! Random bits for UUIDs: a ChaCha20 stream cipher used as a CSPRNG, one per
//! backend, seeded from the operating system the first time that backend
//! needs it. It is never seeded in the postmaster, and a process that finds a
//! generator seeded under another process ID (a fork) reseeds, so no two
//! backends can share a random stream.

use pgrx::pg_sys;

use crate::backend::BackendLocal;
use crate::errors::{IdError, OrRaise};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

static RNG: BackendLocal<Option<(i32, ChaCha20Rng)>> = BackendLocal::new(None);

/// 64 random bits.
#[inline]
pub fn next_u64() -> u64 {
    // SAFETY: MyProcPid is set by PostgreSQL in every process at start-up.
    let pid = unsafe { pg_sys::MyProcPid };
    let mut rng = RNG.borrow_mut();
    match rng.as_mut() {
        Some((seeded_pid, r)) if *seeded_pid == pid => r.next_u64(),
        _ => {
            let mut r = ChaCha20Rng::try_from_os_rng()
                .map_err(|e| IdError::Internal(format!("could not seed the random generator: {e}")))
                .or_raise();
            let v = r.next_u64();
            *rng = Some((pid, r));
            v
        }
    }
}
