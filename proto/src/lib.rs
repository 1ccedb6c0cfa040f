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

    /// Shows whether a token is set, never the token.
    impl std::fmt::Debug for HubSettings {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("HubSettings")
                .field("endpoint", &self.endpoint)
                .field("token", &self.token.as_ref().map(|_| "***"))
                .field("offline", &self.offline)
                .finish()
        }
    }
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
