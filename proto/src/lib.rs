//! Grove's protocols and their generated Rust.
//!
//! # Layout
//! - `grove/runner/v1/runner.proto` -> [`runner::v1`]: daemon <-> runner, over a
//!   Unix socket.
//! - `grove/v1/grove.proto` -> [`v1`]: the public API of the daemon.
//! - [`FILE_DESCRIPTOR_SET`]: both, encoded, for gRPC reflection.

/// The public API.
pub mod v1 {
    tonic::include_proto!("grove.v1");
}

/// The encoded descriptors of every .proto file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("grove_descriptor");

/// The internal runner protocol.
pub mod runner {
    /// Version 1.
    pub mod v1 {
        tonic::include_proto!("grove.runner.v1");
    }
}
