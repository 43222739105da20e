//! The plain-Rust core: ID layouts, the generator state machine, and the
//! codecs. Nothing under this folder imports pgrx (a test checks it), so
//! `cargo test` exercises it without a PostgreSQL server.

pub mod blocks;
pub mod codec;
pub mod error;
pub mod generator;
pub mod handover;
pub mod layout;
pub mod lease;
pub mod pool;
pub mod route;
pub mod schemes;
pub mod uuid_layout;
