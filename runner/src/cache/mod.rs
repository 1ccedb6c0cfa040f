//! KV caches: the per-layer growable buffer ([`kv::KvCache`]) and the sliding-window
//! one ([`rotating::RotatingKvCache`]).
pub mod kv;
pub mod rotating;

pub use kv::KvCache;
pub use rotating::RotatingKvCache;
