//! Building blocks shared by the architectures.
pub mod attention;
pub mod cpu_fast;
pub mod cpu_qmm;
pub mod cuda_qmv;
pub mod decoder;
pub mod embedding;
pub mod gated_delta;
pub mod linear;
pub mod masks;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod quant_ops;
pub mod rope;
pub mod sandwich;
pub mod switch;
