//! Primitives: every call into the operating system (`os`) and the CUDA driver (`cuda`) lives
//! here, the way mimalloc keeps its OS layer in `src/prim/`. The rest of the crate is policy.

pub mod cuda;
pub mod os;
