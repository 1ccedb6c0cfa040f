//! Grove's protocols and their generated Rust.
//!
//! # Layout
//! - `grove/runner/v1/runner.proto` -> [`runner::v1`]: daemon <-> runner, over a
//!   Unix socket.
//! - `grove/v1/grove.proto` (the public API) arrives with the daemon.

/// The internal runner protocol.
pub mod runner {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("grove.runner.v1");
    }
}
