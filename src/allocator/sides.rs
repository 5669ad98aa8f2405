//! The sides chosen from the machine's capabilities, and what they answer: the capabilities
//! and sides (made late where they can wait), the mode, the selection with its reasons, what
//! `fork()` does with the host side's memory, and which kinds of memory device code reaches.

use super::init::{INIT, caps, config, get};
use super::state::{Allocator, Gpu};
use crate::backing::{Kind, RegisteredBacking};
use crate::config;
use crate::error::Result;
use crate::mode::{DeviceSide, HostSide, Mode, ModeRequest, Selection};
use crate::prim::fork::lock;

/// The sides in force with the reason for each, or, before initialisation, those the
/// configuration would select on this machine, API settings included, as [`check`] judges it
/// (nothing is fixed; the configuration's error when it is invalid or asks for what the
/// machine cannot do).
pub fn selection() -> Result<Selection> {
    match get() {
        Some(a) => Ok(a.gpu().selection.clone()),
        None => {
            config().and_then(|cfg| caps().select_sides(cfg.mode, cfg.host_side, cfg.device_side))
        }
    }
}

/// What `fork()` does with the host side's memory (`host::fork_rule`): the rule in force, or,
/// before initialisation, the one the configuration would give on this machine (None when it
/// gives none).
pub fn fork_rule() -> Option<(bool, String)> {
    if let Some(a) = get() {
        return Some(a.host().fork_rule());
    }
    let side = selection().ok()?.sides.host;
    let share = config().ok()?.pinned_fork == config::PinnedFork::Share;
    Some(crate::host::fork_rule(
        side,
        &RegisteredBacking::host_share(share),
    ))
}

impl Allocator {
    /// The capabilities and the sides, probing the machine now if that was left for later.
    pub fn gpu(&self) -> &Gpu {
        if let Some(g) = self.gpu.get() {
            return g;
        }
        // Probed before INIT is held (it takes INIT itself); made under INIT, so that no
        // fork finds it half made.
        let caps = caps().clone();
        let _g = lock(&INIT);
        self.gpu.get_or_init(|| {
            let c = &self.config;
            let mut selection = caps
                .select_sides(c.mode, c.host_side, c.device_side)
                .unwrap_or_else(|e| Selection {
                    mode: Mode::Host,
                    sides: crate::mode::Sides {
                        host: HostSide::Host,
                        device: DeviceSide::None,
                    },
                    host_reason: "plain host memory".into(),
                    device_reason: e.msg,
                });
            let host = self.host.side();
            if self.provisional && selection.sides.host != host {
                // The host side was made before the machine was asked: it stays, as memory
                // that is never pinned (the machine does not need it, or does not allow it).
                crate::backing::never_pin();
                selection.host_reason = format!(
                    "made as pinned host memory before the GPU was asked (UMP_ALLOC_PIN=lazy); \
                     this machine would take {} ({}), so it is never pinned: plain host memory \
                     (UMP_ALLOC_PIN=eager chooses at start)",
                    selection.sides.host.name(),
                    selection.host_reason
                );
                selection.sides.host = host;
                selection.mode = Mode::of(selection.sides);
            }
            Gpu::new(caps, selection)
        })
    }

    /// The mode without asking the machine: the one in force once the machine was asked, else
    /// the one the sides chosen at start make (`host`, or `pinned` for a pinned host side made
    /// before the GPU was asked), else None.
    pub fn mode_known(&self) -> Option<Mode> {
        match self.gpu.get() {
            Some(g) => Some(g.mode),
            None if self.config.mode == ModeRequest::Forced(Mode::Host) => Some(Mode::Host),
            None if self.provisional => Some(Mode::Pinned),
            None => None,
        }
    }

    /// The capabilities and the sides if they were made (see [`gpu`](Self::gpu)).
    pub fn gpu_if_chosen(&self) -> Option<&Gpu> {
        self.gpu.get()
    }

    /// The preset the sides make up (or `Custom`): [`mode_known`](Self::mode_known) where that
    /// answers (so a pinned host side waiting for a GPU says `pinned` and starts no driver),
    /// else it probes the machine (see [`gpu`](Self::gpu)).
    pub fn mode(&self) -> Mode {
        self.mode_known().unwrap_or_else(|| self.gpu().mode)
    }
    /// Whether device code can reach memory of `kind` on this machine.
    #[inline]
    pub fn device_accessible(&self, kind: Kind) -> bool {
        match kind {
            Kind::UMP_KIND_MANAGED | Kind::UMP_KIND_REGISTERED | Kind::UMP_KIND_DEVICE => true,
            // Host memory: where the machine has HMM or ATS.
            Kind::UMP_KIND_HOST | Kind::UMP_KIND_SYSTEM | Kind::UMP_KIND_FOREIGN_HOST => {
                match self.gpu.get() {
                    Some(g) => g.hmm,
                    // The plain fallback of a pinned host side that waits for the first use
                    // of a GPU: host memory only, for now, as its pinned chunks are (asking
                    // the machine would start the driver, after which no fork child could
                    // use CUDA).
                    None if self.provisional && kind == Kind::UMP_KIND_HOST => false,
                    None => self.gpu().hmm,
                }
            }
            Kind::UMP_KIND_FOREIGN_CUDA | Kind::UMP_KIND_UNKNOWN => false,
        }
    }
}
