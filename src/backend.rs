//! State private to one backend process, kept in plain statics.
//!
//! A PostgreSQL backend is single-threaded, and pgrx refuses calls into
//! PostgreSQL from any other thread, so nothing here is ever shared between
//! threads. `thread_local!` would be correct too, but in a loaded library
//! every access to it is a call to `__tls_get_addr`, which the minting path
//! cannot afford.

use std::cell::{RefCell, RefMut};

pub struct BackendLocal<T>(RefCell<T>);

// SAFETY: only the backend's one thread runs extension code (see above).
unsafe impl<T> Sync for BackendLocal<T> {}

impl<T> BackendLocal<T> {
    pub const fn new(value: T) -> Self {
        BackendLocal(RefCell::new(value))
    }

    #[inline]
    pub fn borrow_mut(&self) -> RefMut<'_, T> {
        self.0.borrow_mut()
    }

    #[inline]
    pub fn get(&self) -> T
    where
        T: Copy,
    {
        *self.0.borrow()
    }

    #[inline]
    pub fn set(&self, value: T) {
        *self.0.borrow_mut() = value;
    }
}
