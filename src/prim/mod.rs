//! Primitives: every call into the operating system (`os`; memory files and their locks:
//! `file`), the CUDA driver (`cuda`), the
//! Python and CuPy C APIs (`python`) and PyTorch's C++ library (`torch`) lives here, the way
//! mimalloc keeps its OS layer in `src/prim/`. The rest of the crate is policy.

pub mod cuda;
pub mod file;
pub mod os;
pub mod python;
pub mod torch;
