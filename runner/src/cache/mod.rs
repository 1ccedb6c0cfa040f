//! KV caches. Today: the per-layer growable buffer ([`kv::KvCache`]).
pub mod kv;

pub use kv::KvCache;
