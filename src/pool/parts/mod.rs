//! The parts of a pool that own their state: each is a plain type whose fields are private to
//! its file, which the pool holds as a field and asks through methods. They know nothing of
//! the pool (RMM composes a pool's concerns the same way, as small adaptors). The span set's
//! parts (`free_set`, `idle`, `quick`) are generic over the span descriptor they keep, which
//! is how they stay below the pool's data model (`types.rs`) that holds them.

mod batch;
mod chunks;
mod clock;
mod commit;
mod decay;
mod fence;
mod fork_hold;
mod free_set;
mod idle;
mod lazy;
mod limit;
mod quick;
mod retention;

pub(crate) use batch::Batch;
pub(crate) use chunks::Chunks;
pub(crate) use clock::epoch_ms;
pub(crate) use commit::Commit;
pub(crate) use decay::Decay;
pub use fence::Fence;
pub(crate) use fork_hold::ForkHold;
pub(crate) use free_set::FreeSpans;
pub(crate) use idle::IdleChunks;
pub(crate) use lazy::{Ask, Lazy};
pub(crate) use limit::Charge;
pub use limit::Limit;
pub(crate) use quick::QuickList;
pub(crate) use retention::Retention;
