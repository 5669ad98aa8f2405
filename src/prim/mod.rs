//! Primitives: every call into the operating system (`os`; memory files and their locks:
//! `file`; `fork()`'s handlers, the child flag and the lock guards held across a fork:
//! `fork`), the dynamic loader's view of a loaded library (`elf`: its import slots), the CUDA
//! driver (`cuda`), the Python and CuPy C APIs (`python`), NumPy's allocator functions
//! (`numpy`) and PyTorch's C++ library (`torch`) lives here, the way mimalloc keeps its OS
//! layer in `src/prim/`. The rest of the crate is policy.

pub mod cuda;
pub mod elf;
pub mod file;
pub mod fork;
pub mod numpy;
pub mod os;
pub mod python;
pub mod torch;
